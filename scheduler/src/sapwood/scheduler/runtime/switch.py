"""The switch protocol: move one cell to a new role without losing or duplicating a call.

Phases (each recorded as a ``switch_phase`` event with its duration by the
:class:`~sapwood.scheduler.decisions.DecisionRecorder` the coordinator was given):

1. ``drain`` — the router sends the cell no new call and the cell admits none.
2. ``grace`` — calls in flight get up to ``grace_s`` to finish where they are.
3. ``abort`` — the rest are aborted between two tokens; each keeps its partial output and its KV.
4. ``kv_handoff`` — a :class:`KVHandoff` moves each aborted call's KV (input + partial output) to the
   cell the router picked for it: :class:`MigrateHandoff` exports the tensors through Ray's object
   store and the target imports them; :class:`RecomputeHandoff` prefills them on the target;
   :class:`CheaperHandoff` (the default) picks per call by the rule in its docstring.
5. ``reroute`` — the aborted calls are released; the router continues each on its target (input ids +
   partial output, the remaining token budget); the phase ends when all were re-admitted and the
   source has none left. A call with no target (no other rollout cell) waits in the router's queue
   for the next cell that enters rollout (``work["queued"]``); the switch does not wait for it.
6. ``weight_load`` — entering rollout: the newest published policy; entering train: the authoritative
   parameters of a core cell.
7. ``activate`` — the cell and the router take the new role.

A phase is recorded only when it ran: ``abort`` / ``kv_handoff`` / ``reroute`` only when calls were
left after the grace period (``kv_handoff`` only when one of them had a target), ``weight_load`` only
when weights were loaded. So every recorded duration is a real sample, and the phases together
account for every RPC of the switch (:attr:`SwitchReport.wall_s` is the whole switch measured around
them; :attr:`SwitchReport.work` counts what each phase moved).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import ray

from sapwood.platform.events import CELL_ROLES, CellRole
from sapwood.platform.faults import fault_point
from sapwood.scheduler.decisions import DecisionRecorder

__all__ = ["CheaperHandoff", "KVHandoff", "MigrateHandoff", "RecomputeHandoff", "SwitchCoordinator",
           "SwitchReport"]

#: ``(call key, session, input ids + partial output)`` of an aborted call (``Cell.abort_inflight``).
AbortedCall = tuple[str, str, list[int]]

#: Returns ``(version, checkpoint path)`` of the newest published policy, or None.
PolicySource = Callable[[], "tuple[int, str] | None"]


class KVHandoff(Protocol):
    """Moves the KV of aborted calls from ``source`` to their new cells."""

    name: str

    def transfer(self, source: Any, targets: dict[str, Any], calls: list[AbortedCall]) -> float:
        """``targets`` maps call key to the target cell handle; returns seconds spent."""
        ...


class RecomputeHandoff:
    """The target recomputes each aborted call's KV from its ids (one prefill forward, measured)."""

    name = "recompute"

    def transfer(self, source: Any, targets: dict[str, Any], calls: list[AbortedCall]) -> float:
        t0 = time.perf_counter()
        refs = [targets[key].prefill.remote(session, ids) for key, session, ids in calls if key in targets]
        ray.get(refs)
        return time.perf_counter() - t0


class MigrateHandoff:
    """The source puts each aborted call's KV tensors into Ray's object store (the CPU stand-in for an
    RDMA move) and the target imports them; ``moved`` lists ``(session, bytes, kept)`` of the last
    transfer (``kept`` False: the target serves other weights, so the continuation recomputes)."""

    name = "migrate"

    def __init__(self) -> None:
        self.moved: list[tuple[str, int, bool]] = []

    def transfer(self, source: Any, targets: dict[str, Any], calls: list[AbortedCall]) -> float:
        t0 = time.perf_counter()
        pairs = [(session, targets[key]) for key, session, _ in calls if key in targets]
        exported = ray.get([source.export_kv.remote(session) for session, _ in pairs])
        done = ray.get([target.import_kv.remote(session, ref) for (session, target), ref in zip(pairs, exported,
                                                                                               strict=True)])
        self.moved = [(session, int(d["bytes"]), bool(d["kept"])) for (session, _), d in zip(pairs, done,
                                                                                           strict=True)]
        return time.perf_counter() - t0


@dataclass
class CheaperHandoff:
    """Per call, migrate or recompute, whichever the cost model says is cheaper:

    migrate when ``migrate_overhead_s + bytes / migrate_bytes_per_s < tokens * recompute_s_per_token``,
    else recompute. ``bytes`` and ``tokens`` are the source's cached KV of the call (``Cell.kv_info``);
    a call with no cached KV recomputes. The defaults are the figures ``bench/bench_kv_migration.py``
    measured on the demo's 2-core machine (docs/scheduler.md); re-measure them for another machine.
    ``chosen`` lists ``(session, "migrate" | "recompute")`` of the last transfer.
    """

    migrate_overhead_s: float = 0.012
    migrate_bytes_per_s: float = 150e6
    recompute_s_per_token: float = 6.5e-5
    name: str = "cheaper"
    chosen: list[tuple[str, str]] = field(default_factory=list)

    def choose(self, tokens: int, nbytes: int) -> str:
        migrate_s = self.migrate_overhead_s + nbytes / self.migrate_bytes_per_s
        return "migrate" if migrate_s < tokens * self.recompute_s_per_token else "recompute"

    def transfer(self, source: Any, targets: dict[str, Any], calls: list[AbortedCall]) -> float:
        t0 = time.perf_counter()
        calls = [c for c in calls if c[0] in targets]
        infos = ray.get([source.kv_info.remote(session) for _, session, _ in calls])
        self.chosen = [(session, "recompute" if info is None else self.choose(info["tokens"], info["bytes"]))
                       for (_, session, _), info in zip(calls, infos, strict=True)]
        ways = dict(self.chosen)
        MigrateHandoff().transfer(source, targets, [c for c in calls if ways[c[1]] == "migrate"])
        RecomputeHandoff().transfer(source, targets, [c for c in calls if ways[c[1]] == "recompute"])
        return time.perf_counter() - t0


@dataclass
class SwitchReport:
    """One switch: the roles, each phase's seconds, and the calls it moved."""

    cell_id: str
    from_role: CellRole
    to_role: CellRole
    phases: dict[str, float] = field(default_factory=dict)
    aborted_calls: int = 0
    finished_in_grace: bool = True
    policy_version: int | None = None
    started_at: float = 0.0
    wall_s: float = 0.0
    """The whole switch, driver-side, from the first RPC to the last (≥ :attr:`total_s`)."""
    work: dict[str, int] = field(default_factory=dict)
    """Per phase that moved something: calls aborted / handed off / re-admitted, weight loads (1)."""

    @property
    def total_s(self) -> float:
        """Sum of the phase durations."""
        return sum(self.phases.values())


class SwitchCoordinator:
    """Runs the switch protocol from the driver.

    Args:
        cells: cell id → actor handle.
        roles: cell id → current role (kept up to date by :meth:`switch`).
        router: the :class:`~sapwood.scheduler.runtime.router.Router` actor.
        recorder: records each switch's phases (None: the caller records them, as the live loop does).
        policy_source: newest published ``(version, checkpoint)`` for cells entering rollout.
        core_cell: id of the core cell whose parameters a cell entering train loads (None: the first
            core cell other than the switching one that is training).
        tiers: cell id → ``core`` | ``satellite``.
    """

    def __init__(self, cells: dict[str, Any], roles: dict[str, CellRole], router: Any,
                 recorder: DecisionRecorder | None, *,
                 policy_source: PolicySource | None = None, tiers: dict[str, str] | None = None,
                 handoff: KVHandoff | None = None, grace_s: float = 0.5, reroute_timeout_s: float = 30.0,
                 core_cell: str | None = None) -> None:
        self.cells, self.roles, self.router, self.recorder = cells, roles, router, recorder
        self.policy_source = policy_source
        self.tiers = tiers or dict.fromkeys(cells, "core")
        self.handoff: KVHandoff = handoff or CheaperHandoff()
        self.grace_s, self.reroute_timeout_s = grace_s, reroute_timeout_s
        self.core_cell = core_cell
        self.reports: list[SwitchReport] = []

    def _core_for(self, cell_id: str) -> str | None:
        if self.core_cell is not None and self.core_cell != cell_id:
            return self.core_cell
        for cid, role in self.roles.items():
            if cid != cell_id and role == "train" and self.tiers.get(cid) == "core":
                return cid
        return None

    def switch(self, cell_id: str, to_role: CellRole) -> SwitchReport:
        """Move ``cell_id`` to ``to_role``; returns what each phase took (recorded when there is a recorder)."""
        if cell_id not in self.cells:
            raise KeyError(f"unknown cell {cell_id!r}; known: {sorted(self.cells)}")
        if to_role not in CELL_ROLES:
            raise ValueError(f"role must be one of {CELL_ROLES}, got {to_role!r}")
        cell = self.cells[cell_id]
        rep = SwitchReport(cell_id, self.roles.get(cell_id, "idle"), to_role, started_at=time.time())
        t_start = time.perf_counter()
        if rep.from_role == "rollout" and to_role != "rollout":
            self._leave_rollout(cell_id, cell, rep)
        t = time.perf_counter()
        if to_role == "rollout" and rep.from_role != "rollout":
            found = self.policy_source() if self.policy_source is not None else None
            if found is not None:
                rep.policy_version = found[0]
                ray.get(cell.load_checkpoint.remote(found[1], found[0]))
                rep.phases["weight_load"] = time.perf_counter() - t
                rep.work["weight_load"] = 1
        elif to_role == "train" and rep.from_role != "train":
            core = self._core_for(cell_id)
            if core is not None:
                rep.policy_version, _ = ray.get(cell.load_from_core.remote(self.cells[core]))
                rep.phases["weight_load"] = time.perf_counter() - t
                rep.work["weight_load"] = 1
        t = time.perf_counter()
        ray.get(cell.set_role.remote(to_role))
        ray.get(self.router.set_role.remote(cell_id, to_role))
        rep.phases["activate"] = time.perf_counter() - t
        rep.wall_s = time.perf_counter() - t_start
        self.roles[cell_id] = to_role
        if self.recorder is not None:
            self.recorder.phases(rep.cell_id, rep.to_role, rep.phases.items())
            self.recorder.flush()
        self.reports.append(rep)
        return rep

    def repair(self) -> list[SwitchReport]:
        """Settle every half-done switch a dead driver left. A cell the router still routes as ``rollout``
        whose own role is another was cut between its two activates: the router takes the cell's role (the
        move is finished). A ``rollout`` cell that is draining (at the cell or at the router) had its move
        cut between the drain and the activate: the move is rolled back.
        Its calls in flight (held after their abort, or still running) are aborted (a no-op for held ones),
        handed off and rerouted to the other rollout cells, and the cell takes ``rollout`` again, so it is
        in one consistent role before the next decision, whatever that decides. Returns one report per
        repaired cell (``from_role`` = ``to_role`` = ``rollout``; phases ``abort`` and, with calls,
        ``kv_handoff`` / ``reroute``, ``activate``). Only one driver may move a runtime's cells: a live
        driver's switch in progress looks the same."""
        draining = set(ray.get(self.router.stats.remote())["draining"])
        ids = [cid for cid, role in self.roles.items() if role == "rollout"]
        statuses = ray.get([self.cells[cid].status.remote() for cid in ids])
        out: list[SwitchReport] = []
        for cid, st in zip(ids, statuses, strict=True):
            if st["role"] != "rollout":  # cut after the cell's activate: finish it at the router
                ray.get(self.router.set_role.remote(cid, st["role"]))
                self.roles[cid] = st["role"]
                out.append(SwitchReport(cid, "rollout", st["role"], started_at=time.time()))
                continue
            if not (st["draining"] or cid in draining):
                continue
            cell = self.cells[cid]
            rep = SwitchReport(cid, "rollout", "rollout", started_at=time.time())
            t_start = t = time.perf_counter()
            aborted = ray.get(cell.abort_inflight.remote())
            rep.aborted_calls = len(aborted)
            rep.phases["abort"] = time.perf_counter() - t
            rep.work["abort"] = len(aborted)
            self._reroute_aborted(cid, cell, aborted, rep)
            t = time.perf_counter()
            ray.get(cell.set_role.remote("rollout"))
            ray.get(self.router.set_role.remote(cid, "rollout"))
            rep.phases["activate"] = time.perf_counter() - t
            rep.wall_s = time.perf_counter() - t_start
            if self.recorder is not None:
                self.recorder.phases(rep.cell_id, rep.to_role, rep.phases.items())
                self.recorder.flush()
            self.reports.append(rep)
            out.append(rep)
        return out

    def _leave_rollout(self, cell_id: str, cell: Any, rep: SwitchReport) -> None:
        t = time.perf_counter()
        ray.get(self.router.drain.remote(cell_id))
        ray.get(cell.drain.remote())
        rep.phases["drain"] = time.perf_counter() - t
        t = time.perf_counter()
        rep.finished_in_grace = bool(ray.get(cell.wait_idle.remote(self.grace_s)))
        rep.phases["grace"] = time.perf_counter() - t
        if rep.finished_in_grace:
            return
        t = time.perf_counter()
        aborted = ray.get(cell.abort_inflight.remote())
        rep.aborted_calls = len(aborted)
        rep.phases["abort"] = time.perf_counter() - t
        rep.work["abort"] = len(aborted)
        fault_point("runtime.mid_switch")
        self._reroute_aborted(cell_id, cell, aborted, rep)

    def _reroute_aborted(self, cell_id: str, cell: Any, aborted: list[AbortedCall], rep: SwitchReport) -> None:
        """Hand off, release and reroute the aborted calls of ``cell_id`` (phases ``kv_handoff``, ``reroute``)."""
        if not aborted:  # the calls ended between the grace period and the abort
            return
        t = time.perf_counter()
        keys = [k for k, _, _ in aborted]
        plan = ray.get(self.router.plan_reroute.remote(keys, cell_id))
        targets = {k: self.cells[c] for k, c in plan.items() if c is not None}
        if targets:
            self.handoff.transfer(cell, targets, aborted)
            rep.phases["kv_handoff"] = time.perf_counter() - t  # the plan's RPC included
            rep.work["kv_handoff"] = len(targets)
            t = time.perf_counter()  # else the plan's RPC counts in the reroute
        ray.get(cell.release_aborted.remote())
        # a call with no target (no other rollout cell) waits in the router's queue, which the scheduler
        # reads as demand; the switch does not wait for it
        routed = [k for k in keys if k in targets]
        ok = ray.get(self.router.wait_rerouted.remote(routed, self.reroute_timeout_s))
        if not ok:
            raise RuntimeError(f"switch of {cell_id}: {len(routed)} aborted calls were not re-admitted within "
                               f"{self.reroute_timeout_s} s on their target cells")
        ray.get(cell.wait_idle.remote(self.reroute_timeout_s))
        rep.phases["reroute"] = time.perf_counter() - t
        rep.work["reroute"] = len(routed)
        if len(routed) < len(keys):
            rep.work["queued"] = len(keys) - len(routed)
