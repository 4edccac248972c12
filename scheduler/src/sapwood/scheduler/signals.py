"""The typed snapshot a policy sees each tick, shared by the live loop and the simulator.

Every field is observable on the real systems (see :mod:`sapwood.scheduler.live_signals`); the
simulator fills the same fields from its own state, never from oracle knowledge (no rollout's true
remaining duration appears here). Times are seconds, token counts are integers.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field

from sapwood.platform.events.cells import CellRole, CellTier


@dataclass(frozen=True)
class CellState:
    """One cell as the scheduler knows it.

    ``capacity`` is the number of concurrent rollouts the cell serves in the rollout role (its KV-cache
    budget); ``occupied`` how many of those slots are in use now; ``role_since_s`` is when it last took
    its role (drives the minimum dwell);
    ``switching`` is True while a role switch is in progress (such a cell is never moved again).
    """

    cell_id: str
    tier: CellTier = "core"
    capacity: int = 1
    role: CellRole = "idle"
    role_since_s: float = 0.0
    last_heartbeat_s: float = 0.0
    lost: bool = False
    switching: bool = False
    occupied: int = 0


@dataclass(frozen=True)
class PartitionLag:
    """Ingest consumer lag of one partition: Kafka log-end offset minus the offset stored in the store."""

    topic: str
    partition: int
    log_end: int
    committed: int

    @property
    def lag(self) -> int:
        return max(self.log_end - self.committed, 0)


@dataclass(frozen=True)
class RunBacklog:
    """Finished-but-untrained work of one live run: executions and their trainable (model-output) tokens."""

    run_id: str
    executions: int
    tokens: int


@dataclass(frozen=True)
class Signals:
    """One tick's snapshot.

    ``rollout_demand`` counts rollouts that want a slot now, from queue lag: the calls waiting for a slot
    (``rollout_waiting``) plus the slots occupied on rollout cells (:func:`queue_demand`; the runtime reads
    both from its router; the simulator's paused and admitted-but-unstarted rollouts are its waiting
    calls, its running ones the occupied slots). Where only the store is known (the live loop without a
    router) it is the running executions. ``ingest_lag`` is the Kafka lag where the data path runs
    through Kafka; ``backlog_executions`` the learner's backlog of finished executions.
    ``train_active`` tells whether a training step is
    in progress and ``train_remaining_cell_s`` its estimated remaining cost in cell-seconds;
    ``train_step_cell_s`` is the (rolling) cost of one step in cell-seconds. ``staleness_max`` is the
    largest policy-version lag of the finished-but-untrained backlog. ``switch_cost_mean_s`` is the
    rolling mean of measured switch durations (a prior until the first switch is measured).
    """

    at_s: float
    cells: tuple[CellState, ...]
    batch_size: int
    backlog_executions: int = 0
    backlog_tokens: int = 0
    backlog_by_run: tuple[RunBacklog, ...] = ()
    ingest_lag: tuple[PartitionLag, ...] = ()
    in_flight: int = 0
    in_flight_oldest_age_s: float = 0.0
    rollout_demand: int = 0
    rollout_waiting: int = 0
    train_active: bool = False
    train_remaining_cell_s: float = 0.0
    train_step_cell_s: float = 0.0
    rollout_p50_s: float = 0.0
    rollout_completions_per_s: float = 0.0
    rollout_tokens_per_s: float = 0.0
    learner_tokens_per_s: float = 0.0
    policy_version: int = 0
    staleness_max: int = 0
    staleness_mean: float = 0.0
    switch_cost_mean_s: float = 0.0
    extra: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"Signals.batch_size must be ≥ 1, got {self.batch_size}")
        for name in ("rollout_demand", "rollout_waiting"):
            if getattr(self, name) < 0:
                raise ValueError(f"Signals.{name} must be ≥ 0, got {getattr(self, name)}")
        for name in ("at_s", "train_remaining_cell_s", "train_step_cell_s", "switch_cost_mean_s", "rollout_p50_s"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"Signals.{name} must be a finite number ≥ 0, got {value!r}")
        ids = [c.cell_id for c in self.cells]
        if len(set(ids)) != len(ids):
            raise ValueError(f"Signals.cells has duplicate cell ids: {sorted(ids)}")

    @property
    def ingest_lag_total(self) -> int:
        return sum(p.lag for p in self.ingest_lag)

    def cell(self, cell_id: str) -> CellState:
        for c in self.cells:
            if c.cell_id == cell_id:
                return c
        raise KeyError(f"no cell {cell_id!r} in signals; known: {[c.cell_id for c in self.cells]}")

    def to_json(self) -> dict[str, object]:
        """A JSON-ready dict (the snapshot stored with every role_assigned event)."""
        out = asdict(self)
        out["extra"] = dict(self.extra)
        out["ingest_lag_total"] = self.ingest_lag_total
        return out


def queue_demand(waiting: int, cells: Iterable[CellState]) -> int:
    """Rollout demand from queue lag: ``waiting`` calls plus the occupied slots of the live rollout cells."""
    if waiting < 0:
        raise ValueError(f"waiting calls must be ≥ 0, got {waiting}")
    return waiting + sum(max(c.occupied, 0) for c in cells if c.role == "rollout" and not c.lost)
