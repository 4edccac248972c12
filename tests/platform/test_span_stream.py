"""Spans streamed to PostgreSQL while a batch is planned: nothing lost across pauses, nothing left on failure."""

from __future__ import annotations

import numpy as np
import psycopg
import pytest
import sqlalchemy as sa

from sapwood.platform import schema as t
from sapwood.platform.errors import DigestMismatchError, StoreUnavailableError
from sapwood.platform.events import ModelCall
from sapwood.platform.planner.batch import BatchPlanner
from sapwood.platform.storage.postgres import span_stream
from sapwood.platform.storage.postgres.span_stream import SpanStream
from sapwood.platform.storage.spans import load_spans
from sapwood.platform.store import Store
from sapwood.platform.tokens import digest_bytes
from tests.support.histories import small_execution

pytestmark = pytest.mark.postgres


@pytest.fixture
def pg_store(pg_url: str) -> Store:
    return Store.open(pg_url)


@pytest.fixture
def tiny_flushes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every span goes to the server at once, so each batch opens its COPY early."""
    monkeypatch.setattr(span_stream, "FLUSH_BYTES", 1)


def _counts(store: Store) -> dict[str, int]:
    with store.transaction() as conn:
        return {tb.name: conn.execute(sa.select(sa.func.count()).select_from(tb)).scalar_one()
                for tb in (t.events, t.spans, t.nodes, t.calls, t.executions)}


def _span(seed: int, n: int) -> tuple[bytes, np.ndarray]:
    arr = np.random.default_rng(seed).integers(0, 200_000, n).astype(np.int32)
    return digest_bytes(arr.data), arr


def test_rows_survive_a_pause_for_a_query(pg_store: Store) -> None:
    spans = [_span(seed, 50 + seed) for seed in range(5)]
    with pg_store.transaction() as conn:
        stream = SpanStream(conn, flush_bytes=1)
        for digest, arr in spans[:3]:
            stream.add(digest, arr)
        stream.pause()
        assert conn.execute(sa.select(sa.func.count()).select_from(t.spans)).scalar_one() == 3
        for digest, arr in spans[3:]:
            stream.add(digest, arr)
        stream.close()
        assert stream.rows == 5
        assert stream.copies == 2
        stored = load_spans(conn, [d for d, _ in spans])
    assert {d: np.frombuffer(stored[d], dtype=np.int32).tolist() for d, _ in spans} == {
        d: arr.tolist() for d, arr in spans}


def test_buffered_rows_wait_for_the_next_copy(pg_store: Store) -> None:
    (d1, a1), (d2, a2) = _span(10, 40), _span(11, 40)
    with pg_store.transaction() as conn:
        stream = SpanStream(conn, flush_bytes=1 << 20)  # nothing is sent before close
        stream.add(d1, a1)
        stream.pause()  # no COPY open: a no-op, the row stays buffered
        assert stream.copies == 0
        stream.add(d2, a2)
        stream.close()
        assert stream.copies == 1
        assert set(load_spans(conn, [d1, d2])) == {d1, d2}


def test_apply_pauses_the_stream_for_lookups_and_reconstructs_exactly(
    pg_url: str, tiny_flushes: None
) -> None:
    w = small_execution(31)
    half = len(w.events) // 2
    Store.open(pg_url).apply(w.events[:half])
    store = Store.open(pg_url)  # an empty context cache: the second half's parents are looked up mid-batch
    result = store.apply(w.events[half:])
    assert len(result.applied) == len(w.events) - half
    for call in (e for e in w.events if isinstance(e, ModelCall)):
        expected = np.concatenate([w.context(call.parent), call.appended]) if call.parent else call.appended
        assert np.array_equal(store.reconstruct_input(call.event_id), expected)
    digests = {digest_bytes(np.ascontiguousarray(a).data) for e in w.events for a in e.array_fields().values()
               if a.size}
    with store.transaction() as conn:
        assert set(load_spans(conn, digests)) == digests


def test_strict_failure_after_spans_were_sent_leaves_nothing(pg_store: Store, tiny_flushes: None) -> None:
    w = small_execution(32)
    last_call = max(i for i, e in enumerate(w.events) if isinstance(e, ModelCall))
    bad = w.events[last_call]
    assert isinstance(bad, ModelCall)
    before = _counts(pg_store)
    recorded, bad.input_digest = bad.input_digest, "0" * 32
    with pytest.raises(DigestMismatchError):
        pg_store.apply(w.events)
    assert _counts(pg_store) == before
    bad.input_digest = recorded
    assert len(pg_store.apply(w.events).applied) == len(w.events)  # the store is usable afterwards


def test_rejected_events_spans_are_not_stored(pg_store: Store, tiny_flushes: None) -> None:
    w = small_execution(33)
    last_call = max(i for i, e in enumerate(w.events) if isinstance(e, ModelCall))
    bad = w.events[last_call]
    assert isinstance(bad, ModelCall)
    bad.input_digest = "0" * 32
    result = pg_store.apply(w.events, strict=False)
    assert bad in [r.event for r in result.rejected]
    out_digest = digest_bytes(np.ascontiguousarray(bad.output_ids).data)
    with pg_store.transaction() as conn:
        assert out_digest not in load_spans(conn, [out_digest])
        stored = load_spans(conn, [digest_bytes(np.ascontiguousarray(a).data) for e in result.applied
                                   for a in e.array_fields().values() if a.size])
    assert len(stored) == len({digest_bytes(np.ascontiguousarray(a).data) for e in result.applied
                               for a in e.array_fields().values() if a.size})


def test_connection_killed_while_spans_stream(pg_url: str, tiny_flushes: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The backend dies mid-batch with a COPY open: the error says the store is unavailable, nothing
    is half-stored, and the next batch goes through on a fresh connection."""
    store = Store.open(pg_url)
    w = small_execution(34)
    planned = 0
    original = BatchPlanner.plan

    def plan_then_kill(self: BatchPlanner, event: object) -> None:
        nonlocal planned
        original(self, event)  # type: ignore[arg-type]
        planned += 1
        if planned == len(w.events) // 2:
            pid = self.conn.connection.driver_connection.info.backend_pid  # type: ignore[union-attr]
            with psycopg.connect(store.engine.url.set(drivername="postgresql").render_as_string(hide_password=False),
                                 autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", [pid])

    monkeypatch.setattr(BatchPlanner, "plan", plan_then_kill)
    before = _counts(store)
    with pytest.raises(StoreUnavailableError):
        store.apply(w.events)
    monkeypatch.setattr(BatchPlanner, "plan", original)
    assert _counts(store) == before
    assert len(store.apply(w.events).applied) == len(w.events)
