"""The decision recorder: every scheduler decision and switch phase becomes an event, in one place.

Both the live loop (:mod:`sapwood.scheduler.live_loop`) and the Ray cluster
(:mod:`sapwood.scheduler.runtime.cluster`, through its switch coordinator) record what they decide
here: a ``role_assigned`` event per move (with the policy's name, the reason and the signal snapshot)
and a ``switch_phase`` event per phase of the switch that carried it out. The events go to an
:class:`EventSink` — the rollout transport to Kafka or in-process, or the runtime's store writer —
and ingest builds the ``cells`` and ``scheduler_decisions`` projections from them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from sapwood.platform.events import CellRole, Event, RoleAssigned, SwitchPhase

__all__ = ["DecisionRecorder", "EventSink"]


class EventSink(Protocol):
    """Where recorded events go: ``send`` queues one, ``flush`` waits until all queued ones are delivered."""

    def send(self, event: Event) -> None: ...

    def flush(self, timeout: float | None = None) -> None: ...


@dataclass
class DecisionRecorder:
    """Records the decisions of policy ``policy`` to ``sink``."""

    sink: EventSink
    policy: str = ""

    def assignment(self, cell_id: str, role: CellRole, previous_role: CellRole, *, reason: str = "",
                   signals: Mapping[str, Any] | None = None) -> RoleAssigned:
        """Queue the ``role_assigned`` event of moving ``cell_id`` from ``previous_role`` to ``role``."""
        event = RoleAssigned(cell_id=cell_id, role=role, previous_role=previous_role, reason=reason,
                             policy=self.policy, signals=dict(signals or {}))
        self.sink.send(event)
        return event

    def phases(self, cell_id: str, role: CellRole, phases: Iterable[tuple[str, float]]) -> list[SwitchPhase]:
        """Queue one ``switch_phase`` event per ``(phase, seconds)`` of a switch of ``cell_id`` to ``role``."""
        events = [SwitchPhase(cell_id=cell_id, phase=phase, duration_s=max(float(seconds), 0.0), role=role)
                  for phase, seconds in phases]
        for event in events:
            self.sink.send(event)
        return events

    def flush(self, timeout: float | None = None) -> None:
        """Deliver everything queued."""
        self.sink.flush(timeout)
