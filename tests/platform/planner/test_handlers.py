"""The planner's typed dispatch: every event class has its handler, an unknown class gets a clear error."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest

from sapwood.platform.errors import ValidationError
from sapwood.platform.events import EVENT_TYPES, Event, Prompt
from sapwood.platform.planner.handlers import handler_for, plan_event
from sapwood.platform.store import Store
from tests.support.histories import small_execution


@dataclass(eq=False, kw_only=True)
class Mystery(Event):
    """An event class apply was never taught."""

    kind: ClassVar[str] = "mystery"


@dataclass(eq=False, kw_only=True)
class TaggedPrompt(Prompt):
    """A subclass of a known event class."""


def test_every_event_type_has_its_own_handler() -> None:
    fallback = plan_event.dispatch(object)
    handlers = {cls: handler_for(cls) for cls in EVENT_TYPES.values()}
    assert all(h is not fallback for h in handlers.values())
    assert len(set(handlers.values())) == len(EVENT_TYPES)  # one per class, none shared by accident


def test_unknown_event_type_is_refused_with_a_clear_error() -> None:
    with pytest.raises(ValidationError) as info:
        handler_for(Mystery)
    message = str(info.value)
    assert "no handler for event type" in message
    assert "Mystery" in message
    assert "'mystery'" in message
    for kind in EVENT_TYPES:  # it says what was expected
        assert kind in message
    assert "mystery," not in message
    assert "event," not in message


def test_a_subclass_of_a_known_event_uses_its_handler() -> None:
    assert handler_for(TaggedPrompt) is handler_for(Prompt)


def test_apply_refuses_an_unknown_event_before_any_other_check(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path / 'store.db'}")
    w = small_execution(5)
    # Its execution was never started: the type is still what apply names first.
    odd = Mystery(execution_id="6b1c8a5e-0000-4000-8000-00000000abcd", seq=1)
    with pytest.raises(ValidationError, match="no handler for event type"):
        store.apply([*w.events, odd])
    assert store.stats()["events"] == 0
    result = store.apply([*w.events, odd], strict=False)
    assert [r.event for r in result.rejected] == [odd]
    assert "no handler for event type" in str(result.rejected[0].error)
    assert result.applied == w.events
    store.close()
