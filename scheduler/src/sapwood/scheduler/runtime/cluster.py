"""Assembling the elastic runtime on Ray: the store writer, the router, the cells and the switch coordinator.

:class:`~.cell.Cell`, :class:`~.router.Router` and :class:`~.store_writer.StoreWriter` are plain classes
(unit-tested without Ray); this module alone makes them Ray actors, with ``ray.remote(...)``. Every
decision and switch phase is recorded through one :class:`~sapwood.scheduler.decisions.DecisionRecorder`.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any, cast

import ray

from sapwood.platform.events import CellHeartbeat, CellRegistered, CellRole, CellTier
from sapwood.platform.storage.run_record import CallCounts, ExecutionRecord
from sapwood.scheduler.decisions import DecisionRecorder
from sapwood.scheduler.runtime.cell import RELEASE_WAIT_S, Cell
from sapwood.scheduler.runtime.cell_learner import GroupSpec
from sapwood.scheduler.runtime.core_pinning import core_plan
from sapwood.scheduler.runtime.device_clock import DeviceCosts
from sapwood.scheduler.runtime.router import Router
from sapwood.scheduler.runtime.store_writer import StoreWriter, StoreWriterSink
from sapwood.scheduler.runtime.switch import PolicySource, SwitchCoordinator, SwitchReport

__all__ = ["LOCAL_START_ATTEMPTS", "WORKER_NICENESS", "CellActor", "CellSpec", "ElasticRuntime", "RouterActor",
           "StoreWriterActor", "init_ray"]

#: The actors: no CPU reserved (they share the cores with the executions), never restarted (a lost
#: cell or writer is a fact the runtime reports, not something Ray hides).
CellActor = ray.remote(num_cpus=0, max_restarts=0)(Cell)
RouterActor = ray.remote(num_cpus=0, max_restarts=0)(Router)
StoreWriterActor = ray.remote(num_cpus=0, max_restarts=0)(StoreWriter)


#: Ray starts its workers at niceness 15 so that its own daemons stay responsive. Here the workers
#: are the cells and execution hosts, the work itself: at 15 they starve behind any other busy
#: process on the node (an environment, a compiler, a co-located job), so a local Ray starts them at 0.
WORKER_NICENESS = 0


#: Ray gives a starting raylet a fixed 30 s to register, which a heavily loaded node can miss; a local
#: start is tried this many times before the error is raised.
LOCAL_START_ATTEMPTS = 4


def init_ray(address: str | None = None, *, num_cpus: int = 2, namespace: str | None = None) -> None:
    """Join the cluster at ``address`` or start a local Ray (no dashboard, workers at
    :data:`WORKER_NICENESS`, up to :data:`LOCAL_START_ATTEMPTS` tries); no-op when already started."""
    if ray.is_initialized():
        return
    if address:
        ray.init(address=address, log_to_driver=False, namespace=namespace)
        return
    for attempt in range(1, LOCAL_START_ATTEMPTS + 1):
        try:
            ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False, namespace=namespace,
                     _system_config={"worker_niceness": WORKER_NICENESS})
            return
        except Exception as e:  # Ray raises a bare Exception when its raylet misses the 30 s start window
            if "timed out during startup" not in str(e) or attempt == LOCAL_START_ATTEMPTS:
                raise
            ray.shutdown()


@dataclass(frozen=True)
class CellSpec:
    """A cell to start: its id, capacity (concurrent calls in rollout), tier and first role."""

    cell_id: str
    capacity: int = 2
    role: CellRole = "rollout"
    tier: CellTier = "core"


class ElasticRuntime:
    """Actors of one elastic run; ``model_config``/``state``/``version`` are the weights cells start with;
    ``release_wait_s`` bounds how long an aborted call waits for its switch to release it (:class:`Cell`)."""

    def __init__(self, database_url: str, specs: list[CellSpec], model_config: Any, state: dict[str, Any], *,
                 version: int = 0, seed: int = 0, decode_delay_s: float = 0.0, grace_s: float = 0.5,
                 policy_source: PolicySource | None = None, policy_name: str = "manual",
                 actor_prefix: str | None = None, device_costs: DeviceCosts | None = None,
                 release_wait_s: float = RELEASE_WAIT_S, pin_cores: bool = False) -> None:
        if len({s.cell_id for s in specs}) != len(specs):
            raise ValueError(f"cell ids must be unique, got {[s.cell_id for s in specs]}")
        named = (lambda what: {"name": f"{actor_prefix}-{what}", "lifetime": "detached"}) if actor_prefix else (
            lambda what: {})
        self.writer: Any = cast(Any, StoreWriterActor.options(**named("store-writer")).remote(database_url))
        self.router: Any = cast(Any, RouterActor.options(**named("router")).remote())
        self.specs = {s.cell_id: s for s in specs}
        self.ranks: dict[str, int] = {}
        self.cells: dict[str, Any] = {}
        self.roles: dict[str, CellRole] = {}
        self.policy_name = policy_name
        self.actor_prefix = actor_prefix
        self.sink = StoreWriterSink(self.writer)
        self.recorder = DecisionRecorder(self.sink, policy=policy_name)
        for i, s in enumerate(specs):
            actor = CellActor.options(max_concurrency=s.capacity + 8, **named(f"cell-{s.cell_id}"))
            self.cells[s.cell_id] = actor.remote(s.cell_id, model_config, state, version=version, capacity=s.capacity,
                                                 tier=s.tier, role=s.role, seed=seed * 101 + i,
                                                 decode_delay_s=decode_delay_s, device_costs=device_costs,
                                                 release_wait_s=release_wait_s)
            self.roles[s.cell_id] = s.role
            self.sink.send(CellRegistered(cell_id=s.cell_id, tier=s.tier, capacity=s.capacity,
                                          metadata={"engine": "local-torch", "runtime": "ray"}))
            self.recorder.assignment(s.cell_id, s.role, "idle", reason="initial")
        ray.get([c.status.remote() for c in self.cells.values()])  # wait until every cell is up
        #: cell id → the CPU core it is pinned to (``pin_cores`` and enough cores: ``runtime/core_pinning.py``)
        self.core_pins: dict[str, int] = {}
        plan = core_plan(len(specs)) if pin_cores else None
        if plan is not None:
            pinned = ray.get([self.cells[s.cell_id].pin_to_core.remote(core) for s, core in zip(specs, plan,
                                                                                             strict=True)])
            for s, core, got in zip(specs, plan, pinned, strict=True):
                if got != [core]:
                    raise RuntimeError(f"cell {s.cell_id}: pinned to core {core}, its threads run on {got}")
                self.core_pins[s.cell_id] = core
        ray.get([self.router.add_cell.remote(s.cell_id, self.cells[s.cell_id], s.capacity, s.role) for s in specs])
        self.recorder.flush()
        self.coordinator = SwitchCoordinator(self.cells, self.roles, self.router, self.recorder,
                                             policy_source=policy_source, grace_s=grace_s,
                                             tiers={s.cell_id: s.tier for s in specs})

    def join_learner_group(self, *, micro_batches: int = 4, stall_timeout_s: float = 2.0,
                           learner_backend: str = "torch") -> dict[str, int]:
        """Every cell joins one gloo learner group (``runtime/cell_learner.py``; rank = the cell's place in
        ``specs``, the first is the core) with ``learner_backend`` replicas; returns cell id → rank."""
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        ranks = {cid: i for i, cid in enumerate(self.specs)}
        world = len(ranks)
        ray.get([self.cells[cid].join_group.remote(GroupSpec(port, r, world, micro_batches=micro_batches,
                                                             stall_timeout_s=stall_timeout_s,
                                                             learner_backend=learner_backend))
                 for cid, r in ranks.items()])
        self.ranks = ranks
        return ranks

    def assign(self, cell_id: str, role: CellRole, *, reason: str = "",
               signals: dict[str, Any] | None = None) -> SwitchReport:
        """Record ``role_assigned`` and run the switch; returns the :class:`SwitchReport`."""
        self.recorder.assignment(cell_id, role, self.roles[cell_id], reason=reason, signals=signals)
        self.recorder.flush()
        return self.coordinator.switch(cell_id, role)

    def heartbeat(self) -> list[dict[str, Any]]:
        """Ask every live cell for its status and record a ``cell_heartbeat`` for each that answers."""
        out = []
        for cid, cell in self.cells.items():
            try:
                st = ray.get(cell.status.remote(), timeout=5)
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                continue
            out.append(st)
            figures = {k: st[k] for k in ("in_flight", "served", "aborted", "policy_version")}
            self.sink.send(CellHeartbeat(cell_id=cid, created_at=time.time(), status=figures))
        self.sink.flush()
        return out

    # -- the record (typed reads through the store writer, after what it has queued) ---------------
    def executions(self) -> dict[str, ExecutionRecord]:
        """Every stored execution by id."""
        return dict(ray.get(self.writer.executions.remote()))

    def call_counts(self) -> dict[str, CallCounts]:
        """Stored model calls per execution id."""
        return dict(ray.get(self.writer.call_counts.remote()))

    def switch_phases(self, cell_id: str) -> set[str]:
        """Names of the switch phases recorded for ``cell_id``."""
        return set(ray.get(self.writer.switch_phases.remote(cell_id)))

    def cell_roles(self) -> dict[str, str]:
        """cell id → role in the ``cells`` projection."""
        return dict(ray.get(self.writer.cell_roles.remote()))

    def decisions(self, cell_id: str, role: str | None = None) -> list[dict[str, Any]]:
        """Recorded role decisions of ``cell_id`` (to ``role`` only, when given), oldest first."""
        return list(ray.get(self.writer.decisions.remote(cell_id, role)))

    def shutdown(self) -> None:
        with contextlib.suppress(ray.exceptions.RayActorError):
            ray.get(self.writer.close.remote())
        for actor in [self.router, self.writer, *self.cells.values()]:
            ray.kill(actor)
