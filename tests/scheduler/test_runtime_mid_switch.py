"""``runtime.mid_switch``: the live-loop process driving a switch is SIGKILLed after the leaving cell's calls
were aborted and before they were rerouted. The restarted process first rolls the half-done switch back
(:meth:`SwitchCoordinator.repair`: the held calls rerouted, the cell in ``rollout`` again), then acts on its
own decision: the same move, or keeping the cell. Either way every execution ends with each of its calls
stored once (local Ray, detached runtime actors, SQLite store)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

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


# Each wait below is bounded (the driver's own waits, Background.join); this module's pytest timeout stays above
# their sum, so a slow run fails with the message of the wait that ran out, not pytest's.
pytestmark = pytest.mark.timeout(3000)
DRIVER_TIMEOUT_S = 900.0


def _driver_command(address: str, prefix: str, role: str) -> list[str]:
    return [sys.executable, "-m", "tests.support.switch_driver", address, NAMESPACE, prefix, "c0", role]


def _driver_env(fault: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "SAPWOOD_FAULT"}
    if fault:
        env["SAPWOOD_FAULT"] = fault
    return env


def _crash_mid_switch(rt: ElasticRuntime) -> tuple[dict[str, Any], Background]:
    """Kill a driver moving c0 to train at ``runtime.mid_switch``; returns c0's status after the crash and the
    executions running meanwhile.

    The executions start only once the driver has connected (its ``connected`` line), so however long a loaded
    machine takes to start the driver, calls are still in flight when it looks for one on c0."""
    address = ray.get_runtime_context().gcs_address
    proc = subprocess.Popen(_driver_command(address, str(rt.actor_prefix), "train"), env=_driver_env(
        "runtime.mid_switch"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        seen: list[str] = []
        assert proc.stderr is not None
        for line in proc.stderr:  # ends at EOF: the driver died before connecting
            seen.append(line)
            if line.startswith("connected"):
                break
        else:
            pytest.fail("the driver exited before connecting:\n" + "".join(seen))
        bg = Background(rt, n=4, concurrency=4)
        out, err = proc.communicate(timeout=DRIVER_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL, out + "".join(seen) + err
    # killed mid-switch: c0 admits nothing, its aborted calls wait for a release that never came
    status: dict[str, Any] = ray.get(rt.cells["c0"].status.remote())
    assert status["draining"], status
    assert status["in_flight"] >= 1, status
    assert status["role"] == "rollout", status
    assert ray.get(rt.router.stats.remote())["roles"]["c0"] == "rollout"
    assert rt.decisions("c0", "train") == []  # the crashed loop never flushed its decision
    return status, bg


def _restart(rt: ElasticRuntime, role: str, held: int) -> dict[str, Any]:
    """Restart the driver deciding c0 → ``role``; checks it rolled the half-done switch back first."""
    restarted = subprocess.run(_driver_command(ray.get_runtime_context().gcs_address, str(rt.actor_prefix), role),
                               env=_driver_env(None), capture_output=True, text=True, timeout=DRIVER_TIMEOUT_S)
    assert restarted.returncode == 0, restarted.stdout + restarted.stderr
    report: dict[str, Any] = json.loads(restarted.stdout.strip().splitlines()[-1])
    (repaired,) = report["repaired"]
    assert repaired["cell"] == "c0"
    assert repaired["to_role"] == "rollout"
    assert repaired["aborted_calls"] >= held  # the held calls were aborted again (a no-op) and rerouted
    assert {"abort", "kv_handoff", "reroute", "activate"} <= set(repaired["phases"])
    return report


def _no_call_lost_or_twice(rt: ElasticRuntime, bg: Background, rerouted: int) -> None:
    outcomes = bg.join(timeout=DRIVER_TIMEOUT_S)
    assert len(outcomes) == 4
    in_store = rt.call_counts()
    for o in outcomes:
        assert o.status in ("success", "timeout"), o
        row = in_store[o.execution_id]
        assert row.calls == o.calls == row.distinct_seq  # every completed call stored once, none lost
        assert row.actions == o.steps
    assert sum(o.rerouted_calls for o in outcomes) >= rerouted


def _runtime(tmp_path: Any, tag: str) -> ElasticRuntime:
    # 0.3 s per token: a call is in flight on c0 for seconds, so the switch aborts it (no grace)
    cells = [CellSpec("c0", capacity=2), CellSpec("c1", capacity=2)]
    return ElasticRuntime(f"sqlite:///{tmp_path / 'store.db'}", cells, model_config(), initial_state(),
                          decode_delay_s=0.3, grace_s=0.0,
                          actor_prefix=f"{tag}{time.time_ns()}")


def test_a_switch_killed_mid_way_is_rolled_back_then_redone_losing_and_duplicating_no_call(tmp_path) -> None:  # type: ignore[no-untyped-def]
    rt = _runtime(tmp_path, "mid")
    try:
        status, bg = _crash_mid_switch(rt)
        report = _restart(rt, "train", status["in_flight"])
        assert report["moves"] == {"c0": ["rollout", "train"]}
        assert "weight_load" not in report["phases"]  # no core cell to take parameters from: nothing loaded
        _no_call_lost_or_twice(rt, bg, status["in_flight"])
        assert ray.get(rt.cells["c0"].status.remote())["role"] == "train"
        assert len(rt.decisions("c0", "train")) == 1  # recorded once, by the restart
        assert rt.cell_roles()["c0"] == "train"
    finally:
        rt.shutdown()


def test_a_restart_deciding_otherwise_rolls_the_half_done_switch_back_and_the_cell_serves_again(tmp_path) -> None:  # type: ignore[no-untyped-def]
    rt = _runtime(tmp_path, "back")
    try:
        status, bg = _crash_mid_switch(rt)
        report = _restart(rt, "rollout", status["in_flight"])  # the restart keeps c0 in rollout
        assert report["moves"] == {}
        assert report["aborted_calls"] == 0  # nothing left for a move to abort
        after = ray.get(rt.cells["c0"].status.remote())
        assert after["role"] == "rollout", after
        assert not after["draining"], after  # one consistent role: serving again, at the cell and the router
        stats = ray.get(rt.router.stats.remote())
        assert stats["roles"]["c0"] == "rollout"
        assert "c0" not in stats["draining"]
        _no_call_lost_or_twice(rt, bg, status["in_flight"])
        assert rt.decisions("c0", "train") == []  # no move was made or recorded
        assert rt.cell_roles()["c0"] == "rollout"
    finally:
        rt.shutdown()
