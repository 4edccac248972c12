"""``runtime.mid_switch`` crash rounds: the elastic runtime's fault point, for the chaos campaign and its test.

A round starts a small elastic runtime (two cells ``c0``/``c1`` on local Ray, detached named actors, its own
SQLite store; 0.3 s per decoded token, so a call stays in flight for seconds) and a live-loop process
(:mod:`sapwood.demo.chaos.switch_driver`) armed with ``SAPWOOD_FAULT=runtime.mid_switch`` that moves ``c0`` to
``train`` with no grace. Four executions start once the driver has connected; the driver aborts ``c0``'s calls
in flight and dies by SIGKILL before it reroutes them. Then ``c0`` admits nothing and its aborted calls wait.
A restarted driver first rolls the half-done switch back (:meth:`SwitchCoordinator.repair`: the held calls
rerouted, ``c0`` in ``rollout`` at the cell and the router), then acts on its own decision: the same move
(``train``) or keeping the cell (``rollout``). Checked: every execution ends, every completed call is stored
once (none lost, none twice), the calls that were held took another attempt and were stored once, and the
decision is recorded once by the restart (none when it kept the cell).

Every check raises :class:`MidSwitchError` with what it saw, so the campaign and the test fail the same way.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray

from sapwood.demo.elastic.small_runtime import Background, initial_state, model_config
from sapwood.platform.storage import run_record
from sapwood.platform.storage.dialects import embedded_url
from sapwood.platform.store import Store
from sapwood.scheduler.runtime.cluster import CellSpec, ElasticRuntime, init_ray

__all__ = ["FAULT", "MidSwitchError", "RoundResult", "crash_mid_switch", "no_call_lost_or_twice", "restart_driver",
           "run_round", "run_rounds", "start_round_runtime"]

FAULT = "runtime.mid_switch"
#: Bound of each wait of a round (the driver's start and run, the executions); a loaded machine is slow.
WAIT_S = 900.0
EXECUTIONS = 4


class MidSwitchError(AssertionError):
    """A round's check failed (what was expected, what was seen)."""


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise MidSwitchError(message)


def start_round_runtime(store_path: Path, tag: str) -> ElasticRuntime:
    """Two cells of capacity 2 at 0.3 s per token, no grace, named actors ``{tag}{ns}-…``; a SQLite store.
    The calls the crash holds wait up to :data:`WAIT_S` for a release, so that the restart's repair is what
    releases them, however slowly the restarted driver starts (with the default 10 s, a call left
    unreleased answers ``aborted`` by itself and the router continues it without the repair)."""
    cells = [CellSpec("c0", capacity=2), CellSpec("c1", capacity=2)]
    return ElasticRuntime(embedded_url(store_path), cells, model_config(), initial_state(), decode_delay_s=0.3,
                          grace_s=0.0, actor_prefix=f"{tag}{time.time_ns()}", release_wait_s=WAIT_S)


def _driver(rt: ElasticRuntime, role: str) -> list[str]:
    ctx = ray.get_runtime_context()
    return [sys.executable, "-m", "sapwood.demo.chaos.switch_driver", ctx.gcs_address, str(ctx.namespace),
            str(rt.actor_prefix), "c0", role]


def _env(fault: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "SAPWOOD_FAULT"}
    if fault:
        env["SAPWOOD_FAULT"] = fault
    return env


def crash_mid_switch(rt: ElasticRuntime, *, run_id: str = "run") -> tuple[dict[str, Any], Background]:
    """Kill a driver moving ``c0`` to train at :data:`FAULT`; returns ``c0``'s status after the crash and the
    executions running meanwhile (they start once the driver has connected, however slowly it started)."""
    proc = subprocess.Popen(_driver(rt, "train"), env=_env(FAULT), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    seen: list[str] = []
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # ends at EOF: the driver died before connecting
            seen.append(line)
            if line.startswith("connected"):
                break
        else:
            raise MidSwitchError("the switch driver exited before connecting:\n" + "".join(seen))
        bg = Background(rt, n=EXECUTIONS, concurrency=EXECUTIONS, run_id=run_id)
        out, err = proc.communicate(timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    _check(proc.returncode == -signal.SIGKILL,
           f"the armed driver should die by SIGKILL at {FAULT}, exited {proc.returncode}:\n{out}{''.join(seen)}{err}")
    status: dict[str, Any] = ray.get(rt.cells["c0"].status.remote())
    # killed mid-switch: c0 admits nothing, its aborted calls wait for a release that never came
    _check(bool(status["draining"]) and int(status["in_flight"]) >= 1 and status["role"] == "rollout",
           f"after the crash c0 should be draining in rollout with held calls, is {status}")
    router_role = ray.get(rt.router.stats.remote())["roles"]["c0"]
    _check(router_role == "rollout", f"the router should still route c0 as rollout, has {router_role}")
    _check(rt.decisions("c0", "train") == [], "the crashed loop recorded its decision before its move returned")
    return status, bg


def restart_driver(rt: ElasticRuntime, role: str, held: int) -> dict[str, Any]:
    """Restart the driver deciding ``c0`` → ``role``; checks it rolled the half-done switch back first."""
    done = subprocess.run(_driver(rt, role), env=_env(None), capture_output=True, text=True, timeout=WAIT_S)
    _check(done.returncode == 0, f"the restarted driver exited {done.returncode}:\n{done.stdout}{done.stderr}")
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    repaired = report["repaired"]
    _check(len(repaired) == 1 and repaired[0]["cell"] == "c0" and repaired[0]["to_role"] == "rollout",
           f"the restart should roll c0's half-done switch back to rollout first, repaired {repaired}")
    _check(repaired[0]["aborted_calls"] >= held,  # the held calls were aborted again (a no-op) and rerouted
           f"the repair rerouted {repaired[0]['aborted_calls']} calls, {held} were held")
    phases = set(repaired[0]["phases"])
    _check({"abort", "kv_handoff", "reroute", "activate"} <= phases, f"the repair's phases were {sorted(phases)}")
    unreleased = ray.get(rt.cells["c0"].status.remote())["unreleased_aborts"]
    _check(unreleased == 0, f"{unreleased} held calls answered before the repair released them")
    return report


def no_call_lost_or_twice(rt: ElasticRuntime, bg: Background, held: int) -> dict[str, int]:
    """Every execution ended and each completed call is stored once; returns the round's counts."""
    outcomes = bg.join(timeout=WAIT_S)
    _check(len(outcomes) == EXECUTIONS, f"{len(outcomes)} of {EXECUTIONS} executions ended")
    in_store = rt.call_counts()
    calls = 0
    for o in outcomes:
        _check(o.status in ("success", "timeout"), f"execution {o.execution_id} ended {o.status}")
        row = in_store.get(o.execution_id)
        _check(row is not None and row.calls == o.calls == row.distinct_seq and row.actions == o.steps,
               f"execution {o.execution_id} completed {o.calls} calls ({o.steps} actions), stored {row}")
        calls += o.calls
    rerouted = sum(o.rerouted_calls for o in outcomes)
    _check(rerouted >= held, f"{rerouted} calls rerouted, {held} were held on c0")
    return {"executions": len(outcomes), "calls": calls, "rerouted": rerouted}


@dataclass(frozen=True)
class RoundResult:
    """One round: the restart's decision, the calls held by the crash, the restart's move's phases (none when
    it kept the cell), the round's counts, its seconds."""

    restart_role: str
    held_calls: int
    move_phases: tuple[str, ...]
    calls: int
    rerouted_calls: int
    stored_rerouted_calls: int
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return {"restart_role": self.restart_role, "held_calls": self.held_calls,
                "move_phases": list(self.move_phases), "calls": self.calls,
                "rerouted_calls": self.rerouted_calls, "stored_rerouted_calls": self.stored_rerouted_calls,
                "seconds": self.seconds}


def run_round(out: Path, restart_role: str, *, tag: str = "mid") -> RoundResult:
    """One crash at :data:`FAULT` and a restart deciding ``restart_role`` (``train``: redo the move;
    ``rollout``: keep the cell), on a runtime with its own store under ``out``; Ray must be initialised."""
    out.mkdir(parents=True, exist_ok=True)
    store_path = out / "store.db"
    t0 = time.monotonic()
    rt = start_round_runtime(store_path, tag)
    try:
        status, bg = crash_mid_switch(rt)
        held = int(status["in_flight"])
        report = restart_driver(rt, restart_role, held)
        if restart_role == "train":
            _check(report["moves"] == {"c0": ["rollout", "train"]}, f"the restart's moves were {report['moves']}")
        else:
            _check(report["moves"] == {} and report["aborted_calls"] == 0,
                   f"a restart keeping c0 should move and abort nothing, moved {report['moves']}")
        counts = no_call_lost_or_twice(rt, bg, held)
        after = ray.get(rt.cells["c0"].status.remote())
        # one consistent role at the cell and the router (a cell out of rollout admits no call: "draining")
        _check(after["role"] == restart_role and after["draining"] == (restart_role != "rollout"),
               f"c0 ended as {after}")
        stats = ray.get(rt.router.stats.remote())
        _check(stats["roles"]["c0"] == restart_role and "c0" not in stats["draining"],
               f"the router has c0 as {stats['roles']['c0']}, draining {stats['draining']}")
        decisions = len(rt.decisions("c0", "train"))
        _check(decisions == (1 if restart_role == "train" else 0),
               f"{decisions} decisions c0 → train recorded (the restart records its own move once, none if kept)")
        _check(rt.cell_roles()["c0"] == restart_role, f"the cells projection has c0 as {rt.cell_roles()['c0']}")
    finally:
        rt.shutdown()
    store = Store.open(embedded_url(store_path))
    try:
        with store.transaction() as conn:
            stored_rerouted = run_record.rerouted_calls(conn)
    finally:
        store.close()
    _check(stored_rerouted >= held, f"{stored_rerouted} stored calls took another attempt, {held} were held")
    return RoundResult(restart_role, held, tuple(report["phases"]), counts["calls"], counts["rerouted"],
                       stored_rerouted, round(time.monotonic() - t0, 1))


def run_rounds(out: Path, rounds: int) -> list[RoundResult]:
    """``rounds`` crash-and-restart rounds, the restart's decision alternating (redo the move, keep the cell);
    starts a local Ray for them (and shuts it down) unless one is running."""
    started = not ray.is_initialized()
    if started:
        init_ray(num_cpus=2, namespace="sapwood-chaos-mid-switch")
    try:
        return [run_round(out / f"round{i}", "train" if i % 2 == 0 else "rollout", tag=f"round{i}-")
                for i in range(rounds)]
    finally:
        if started:
            ray.shutdown()
