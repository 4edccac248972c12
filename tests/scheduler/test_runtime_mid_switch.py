"""``runtime.mid_switch``: the live-loop process driving a switch is SIGKILLed after the leaving cell's calls
were aborted and before they were rerouted; the restarted process moves the cell again and every execution
ends with each of its calls stored once (local Ray, detached runtime actors, SQLite store)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

ray = pytest.importorskip("ray")

from sapwood.scheduler.runtime.cluster import CellSpec, ElasticRuntime, init_ray  # noqa: E402
from tests.support.elastic_runtime import Background, initial_state, model_config  # noqa: E402

NAMESPACE = "sapwood-mid-switch"


@pytest.fixture(scope="module", autouse=True)
def local_ray() -> Iterator[None]:
    init_ray(num_cpus=2, namespace=NAMESPACE)
    yield
    ray.shutdown()


def _driver(address: str, prefix: str, fault: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "SAPWOOD_FAULT"}
    if fault:
        env["SAPWOOD_FAULT"] = fault
    return subprocess.run([sys.executable, "-m", "tests.support.switch_driver", address, NAMESPACE, prefix, "c0",
                           "train"],
                          env=env, capture_output=True, text=True, timeout=1200)


def test_a_switch_killed_mid_way_is_finished_by_the_restart_losing_and_duplicating_no_call(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # 0.3 s per token: a call is in flight on c0 for seconds, so the switch aborts it (no grace)
    rt = ElasticRuntime(f"sqlite:///{tmp_path / 'store.db'}", [CellSpec("c0", capacity=2), CellSpec("c1", capacity=2)],
                        model_config(), initial_state(), decode_delay_s=0.3, grace_s=0.0,
                        actor_prefix=f"mid{time.time_ns()}")
    address = ray.get_runtime_context().gcs_address
    try:
        bg = Background(rt, n=4, concurrency=4)
        crashed = _driver(address, str(rt.actor_prefix), "runtime.mid_switch")
        assert crashed.returncode == -signal.SIGKILL, crashed.stdout + crashed.stderr
        # killed mid-switch: c0 admits nothing, its aborted calls wait for a release that never came
        status = ray.get(rt.cells["c0"].status.remote())
        assert status["draining"], status
        assert status["in_flight"] >= 1, status
        assert status["role"] == "rollout", status
        assert ray.get(rt.router.stats.remote())["roles"]["c0"] == "rollout"
        assert rt.decisions("c0", "train") == []  # the crashed loop never flushed its decision

        restarted = _driver(address, str(rt.actor_prefix), None)
        assert restarted.returncode == 0, restarted.stdout + restarted.stderr
        report = json.loads(restarted.stdout.strip().splitlines()[-1])
        assert report["moves"] == {"c0": ["rollout", "train"]}
        assert report["aborted_calls"] >= status["in_flight"]  # the held calls were aborted again and rerouted
        assert {"abort", "kv_handoff", "reroute"} <= set(report["phases"])
        assert "weight_load" not in report["phases"]  # no core cell to take parameters from: nothing loaded

        outcomes = bg.join()
        assert len(outcomes) == 4
        in_store = rt.call_counts()
        for o in outcomes:
            assert o.status in ("success", "timeout"), o
            row = in_store[o.execution_id]
            assert row.calls == o.calls == row.distinct_seq  # every completed call stored once, none lost
            assert row.actions == o.steps
        assert sum(o.rerouted_calls for o in outcomes) >= report["aborted_calls"]
        assert ray.get(rt.cells["c0"].status.remote())["role"] == "train"
        assert len(rt.decisions("c0", "train")) == 1  # recorded once, by the restart
        assert rt.cell_roles()["c0"] == "train"
    finally:
        rt.shutdown()
