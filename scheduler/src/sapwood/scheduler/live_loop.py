"""The live loop: read signals, decide, record every decision as an event, hand moves to an actuator.

Decisions are recorded by :class:`~sapwood.scheduler.decisions.DecisionRecorder`: ``role_assigned`` and
``switch_phase`` events through the same transport as rollout events (Kafka → ingest, or in-process), so
the ``cells`` projection and ``scheduler_decisions`` are built by ingest like every other projection.
Until a decision shows in the projection the loop overlays it on what it reads (the cell counts as
switching), so a slow ingest never makes it decide the same move twice.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from sapwood.platform.events.cells import CellRole
from sapwood.scheduler.decisions import DecisionRecorder, EventSink
from sapwood.scheduler.metrics import SchedulerMetrics
from sapwood.scheduler.policy import Decision, Policy, check_decision
from sapwood.scheduler.signals import Signals

log = logging.getLogger(__name__)


class Actuator(Protocol):
    """Carries out a move; returns the phases it went through as ``(phase, seconds)``."""

    def move(self, cell_id: str, from_role: CellRole, to_role: CellRole, reason: str) -> list[tuple[str, float]]: ...


class LoggingActuator:
    """Moves nothing: logs each move (the Ray runtime's actuator comes later). Reports no switch phases."""

    def __init__(self) -> None:
        self.moves: list[tuple[str, CellRole, CellRole, str]] = []

    def move(self, cell_id: str, from_role: CellRole, to_role: CellRole, reason: str) -> list[tuple[str, float]]:
        log.info("move %s: %s → %s (%s)", cell_id, from_role, to_role, reason)
        self.moves.append((cell_id, from_role, to_role, reason))
        return []


@dataclass
class TickResult:
    signals: Signals
    decision: Decision
    moves: dict[str, tuple[CellRole, CellRole]]
    seconds: float


@dataclass
class SchedulerLoop:
    """One decision per :meth:`tick`; :meth:`run` ticks every ``tick_s`` until ``stop`` says so."""

    read: Callable[[], Signals]
    policy: Policy
    sink: EventSink
    actuator: Actuator = field(default_factory=LoggingActuator)
    metrics: SchedulerMetrics | None = None
    #: cell_id → (role, sent at): decisions sent but not yet in the projection
    pending: dict[str, tuple[CellRole, float]] = field(default_factory=dict)

    def _overlay(self, s: Signals) -> Signals:
        cells = []
        for c in s.cells:
            want = self.pending.get(c.cell_id)
            if want is not None and c.role == want[0]:
                del self.pending[c.cell_id]
                want = None
            cells.append(c if want is None else dataclasses.replace(c, role=want[0], role_since_s=want[1],
                                                                   switching=True))
        return dataclasses.replace(s, cells=tuple(cells))

    def __post_init__(self) -> None:
        self.recorder = DecisionRecorder(self.sink, policy=getattr(self.policy, "name", type(self.policy).__name__))

    def tick(self) -> TickResult:
        t0 = time.perf_counter()
        s = self._overlay(self.read())
        assignment = {c.cell_id: c.role for c in s.cells}
        decision = check_decision(self.policy.decide(s, assignment), s)
        seconds = time.perf_counter() - t0
        moves = decision.moves(assignment)
        snapshot = s.to_json() if moves else {}
        for cell_id, (old, new) in sorted(moves.items()):
            reason = decision.reasons.get(cell_id, "")
            # the decision is recorded once its move returned: a loop killed mid-move leaves none, so the
            # restart, reading the old role, decides the move again (docs/operations.md)
            phases = self.actuator.move(cell_id, old, new, reason)
            self.recorder.assignment(cell_id, new, old, reason=reason, signals=snapshot)
            self.recorder.phases(cell_id, new, phases)
            self.pending[cell_id] = (new, s.at_s)
        if moves:
            self.recorder.flush()
        if self.metrics is not None:
            self.metrics.observe(s)
            self.metrics.decision_seconds.observe(seconds)
            for _, new in moves.values():
                self.metrics.moves.labels(new).inc()
        return TickResult(s, decision, moves, seconds)

    def run(self, tick_s: float, ticks: int = 0, stop: Callable[[], bool] = lambda: False) -> int:
        """Tick every ``tick_s`` seconds (``ticks`` times, or until ``stop()`` when 0); return ticks done."""
        done = 0
        while not stop() and (ticks == 0 or done < ticks):
            start = time.monotonic()
            try:
                result = self.tick()
                log.info("tick %d: %d moves, decided in %.1f ms", done, len(result.moves), result.seconds * 1e3)
            except Exception:  # a failed read (store or broker down) skips the tick, never ends the loop
                log.exception("tick %d failed; retrying next tick", done)
            done += 1
            time.sleep(max(tick_s - (time.monotonic() - start), 0.0) if (ticks == 0 or done < ticks) else 0.0)
        return done
