"""A replayed event id is a duplicate only when its content is identical; otherwise a conflict naming what differs."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import sqlalchemy as sa

from sapwood.platform import schema as t
from sapwood.platform.codec import decode, encode
from sapwood.platform.errors import ConflictError
from sapwood.platform.events import Event, ExecutionFinished, ModelCall, Observation
from sapwood.platform.replays import content_digest
from sapwood.platform.store import Store
from sapwood.platform.writer import ExecutionWriter
from tests.support.histories import small_execution


def _first(events: list[Event], cls: type[Event]) -> Event:
    return next(e for e in events if isinstance(e, cls))


def _flipped(ev: Event, name: str) -> Event:
    other = copy.copy(ev)
    arr = getattr(ev, name).copy()
    arr[len(arr) // 2] += 1
    object.__setattr__(other, name, arr)
    return other


def test_identical_replays_from_the_wire_are_duplicates(store: Store) -> None:
    w = small_execution(11)
    store.apply(w.events)
    again = store.apply([decode(encode(e, compress=True)) for e in w.events])
    assert again.duplicates == len(w.events)
    assert not again.applied
    assert not again.rejected


@pytest.mark.parametrize(("cls", "name"), [(Observation, "token_ids"), (ModelCall, "output_ids"),
                                           (ModelCall, "output_logprobs")])
def test_a_flipped_array_value_is_a_conflict_naming_the_array(store: Store, cls: type[Event], name: str) -> None:
    w = small_execution(12)
    store.apply(w.events)
    clash = _flipped(_first(w.events, cls), name)
    with pytest.raises(ConflictError, match=f"{name} differ"):
        store.apply([clash])
    result = store.apply([clash], strict=False)
    assert [r.error.reason for r in result.rejected] == ["conflict"]
    assert result.duplicates == 0


def test_a_changed_scalar_is_a_conflict_naming_the_field(store: Store) -> None:
    w = small_execution(13)
    store.apply(w.events)
    clash = copy.copy(_first(w.events, ExecutionFinished))
    clash.reward = (clash.reward or 0.0) + 0.5  # type: ignore[attr-defined]
    with pytest.raises(ConflictError, match="reward differ"):
        store.apply([clash])


def test_full_token_call_replays_compare_their_whole_input(store: Store) -> None:
    w = ExecutionWriter(run_id="r", task_id="t")
    w.start()
    p = w.prompt(np.arange(10, 30, dtype=np.int32))
    first = w.call(p.node_id, np.arange(3, dtype=np.int32), [5, 6], [-0.1, -0.2])
    full_input = np.concatenate([w.context(first.output_node_id), np.array([7, 8], dtype=np.int32)])
    call = w.call(None, full_input, [9], [-0.3])
    store.apply(w.events)
    assert store.apply([call]).duplicates == 1, "the stored body is normalized, the replay still matches"
    clash = _flipped(call, "appended")
    clash.input_digest = call.input_digest  # only the digest of the content changes
    with pytest.raises(ConflictError, match="appended differ"):
        store.apply([clash])


def test_conflicting_ids_inside_one_batch(store: Store) -> None:
    w = small_execution(14)
    obs = _first(w.events, Observation)
    clash = _flipped(obs, "token_ids")
    with pytest.raises(ConflictError, match="twice in one batch"):
        store.apply([*w.events, clash])
    same = store.apply([*w.events, copy.copy(obs)])
    assert same.duplicates == 1
    assert len(same.applied) == len(w.events)


def test_every_stored_event_keeps_its_content_digest(store: Store) -> None:
    w = small_execution(15)
    store.apply(w.events)
    with store.transaction() as conn:
        stored = dict(conn.execute(sa.select(t.events.c.event_id, t.events.c.content_digest)).all())
    assert {str(k): bytes(v) for k, v in stored.items()} == {e.event_id: content_digest(e) for e in w.events}
    assert len(set(stored.values())) == len(w.events)


def _stored_created_at(store: Store, event_id: str) -> float:
    with store.engine.connect() as conn:
        return float(conn.execute(sa.select(t.events.c.created_at).where(t.events.c.event_id == event_id)).scalar_one())


def test_a_retry_with_a_new_created_at_is_a_duplicate_keeping_the_first_stamp(store: Store) -> None:
    """``created_at`` is not part of an event's identity (docs/wire-format.md §7): a producer that stamps
    the time at send re-stamps each retry, and the retry is a duplicate, not a conflict."""
    w = small_execution(14)
    store.apply(w.events)
    first = float(w.events[3].created_at)
    late = decode(encode(w.events[3], compress=True))
    late.created_at = first + 1.0
    again = store.apply([late], strict=False)
    assert again.duplicates == 1
    assert again.rejected == []
    assert _stored_created_at(store, late.event_id) == pytest.approx(first)


def test_a_retry_with_a_new_created_at_in_the_same_batch_is_a_duplicate(store: Store) -> None:
    w = small_execution(15)
    twin = copy.copy(w.events[-1])
    twin.created_at += 5.0
    result = store.apply([*w.events, twin], strict=False)
    assert result.duplicates == 1
    assert result.rejected == []


def test_a_digest_stored_before_created_at_left_the_identity_still_matches(store: Store) -> None:
    """Rows written by an older release hold a digest that covered ``created_at``: an exact replay of
    them is still a duplicate."""
    w = small_execution(16)
    store.apply(w.events)
    ev = w.events[2]
    with store.engine.begin() as conn:
        conn.execute(t.events.update().where(t.events.c.event_id == ev.event_id).values(
            content_digest=content_digest(ev, legacy_created_at=True)))
    assert store.apply([ev]).duplicates == 1
    assert content_digest(ev, legacy_created_at=True) != content_digest(ev)
