"""The one decision recorder: role_assigned and switch_phase events as the live loop and the cluster send them."""

from __future__ import annotations

import pytest

from sapwood.platform.errors import ValidationError
from sapwood.platform.events import Event, RoleAssigned, SwitchPhase
from sapwood.scheduler.decisions import DecisionRecorder


class ListSink:
    def __init__(self) -> None:
        self.sent: list[Event] = []
        self.flushed = 0

    def send(self, event: Event) -> None:
        self.sent.append(event)

    def flush(self, timeout: float | None = None) -> None:
        self.flushed += 1


def test_an_assignment_and_its_phases_become_events_in_order() -> None:
    sink = ListSink()
    rec = DecisionRecorder(sink, policy="elastic")
    rec.assignment("c0", "train", "rollout", reason="backlog", signals={"backlog": 4})
    rec.phases("c0", "train", [("drain", 0.5), ("weight_load", -1e-9)])
    rec.flush()
    first, drain, load = sink.sent
    assert isinstance(first, RoleAssigned)
    assert (first.cell_id, first.role, first.previous_role) == ("c0", "train", "rollout")
    assert (first.policy, first.reason, first.signals) == ("elastic", "backlog", {"backlog": 4})
    assert isinstance(drain, SwitchPhase)
    assert (drain.phase, drain.duration_s, drain.role) == ("drain", 0.5, "train")
    assert isinstance(load, SwitchPhase)
    assert load.duration_s == 0.0, "a clock's tiny negative difference is recorded as 0"
    assert sink.flushed == 1


def test_an_unknown_role_fails_validation() -> None:
    sink = ListSink()
    event = DecisionRecorder(sink).assignment("c0", "training", "idle")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match=r"role_assigned\.role must be one of"):
        event.validate()
