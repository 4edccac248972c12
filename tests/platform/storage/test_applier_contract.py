"""The event applier contract, run against the SQLite and the PostgreSQL applier.

What every :class:`~sapwood.platform.storage.applier.EventApplier` must do: apply a batch in the
caller's transaction (all of it or, strict, nothing), skip exact replays, reject bad events without a
trace, credit every phase to the timer passed in, and answer the planner's look-ups
(:class:`~sapwood.platform.planner.ports.StoredState`) with what it stored. Both dialects store the
same projections for the same events.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import sqlalchemy as sa

from sapwood.platform import schema as t
from sapwood.platform.apply import apply_events
from sapwood.platform.errors import DigestMismatchError
from sapwood.platform.events import CellRegistered, ModelCall, PolicyPublished, SegmentBoundary
from sapwood.platform.phase_timer import PhaseTimer
from sapwood.platform.storage.applier import EventApplier
from sapwood.platform.storage.backends import event_applier
from sapwood.platform.storage.postgres.applier import PostgresApplier
from sapwood.platform.storage.sqlite.applier import SqliteApplier
from sapwood.platform.store import Store
from sapwood.platform.tokens import digest_bytes
from sapwood.platform.tree import Role
from tests.support.histories import small_execution

PHASES = {"lookups", "digests", "plan", "spans", "payloads", "store"}


def _counts(store: Store) -> dict[str, int]:
    with store.transaction() as conn:
        return {tb.name: conn.execute(sa.select(sa.func.count()).select_from(tb)).scalar_one()
                for tb in (t.events, t.spans, t.nodes, t.calls, t.executions, t.segments)}


def test_event_applier_picks_the_dialects_applier(store: Store) -> None:
    with store.transaction() as conn:
        applier: EventApplier = event_applier(conn)
    assert type(applier) is {"sqlite": SqliteApplier, "postgresql": PostgresApplier}[store.dialect]


def test_a_batch_lands_whole_and_a_replay_changes_nothing(store: Store) -> None:
    w = small_execution(41)
    timer = PhaseTimer()
    with store.transaction() as conn:
        first = apply_events(conn, w.events, timer=timer)
    assert len(first.applied) == len(w.events)
    assert first.duplicates == 0
    assert not first.rejected
    assert first.tokens == sum(e.n_tokens() for e in w.events)
    counts = _counts(store)
    assert counts["events"] == len(w.events)
    assert counts["calls"] == sum(isinstance(e, ModelCall) for e in w.events)
    assert counts["segments"] == sum(isinstance(e, SegmentBoundary) for e in w.events) == 2
    hashed = store.projection_hash()
    with store.transaction() as conn:
        again = apply_events(conn, w.events, timer=timer)
    assert (again.applied, again.duplicates, again.rejected) == ([], len(w.events), [])
    assert _counts(store) == counts
    assert store.projection_hash() == hashed
    # The timer got every phase of both batches; each result holds its own batch's seconds.
    assert set(first.timings) == set(again.timings) == set(timer.totals) == PHASES
    assert all(v >= 0 for v in (*first.timings.values(), *again.timings.values()))
    for phase in PHASES:
        assert timer.totals[phase] == pytest.approx(first.timings[phase] + again.timings[phase])


def test_strict_failure_writes_nothing_and_lenient_rejects_only_the_bad_event(store: Store) -> None:
    w = small_execution(42)
    last_call = max(i for i, e in enumerate(w.events) if isinstance(e, ModelCall))
    bad = w.events[last_call]
    assert isinstance(bad, ModelCall)
    assert bad.seq is not None
    bad.input_digest = "0" * 32
    before = _counts(store)
    with pytest.raises(DigestMismatchError), store.transaction() as conn:
        apply_events(conn, w.events)
    assert _counts(store) == before
    with store.transaction() as conn:
        result = apply_events(conn, w.events, strict=False)
    assert [r.event for r in result.rejected] == [e for e in w.events[last_call:] if e.seq is not None
                                                  and e.seq >= bad.seq]  # its successors break the order
    assert result.applied == w.events[:last_call]
    out_digest = digest_bytes(np.ascontiguousarray(bad.output_ids).data)
    with store.transaction() as conn:
        assert conn.execute(sa.select(t.spans.c.digest).where(t.spans.c.digest == out_digest)).first() is None
        assert conn.execute(sa.select(t.calls).where(t.calls.c.call_id == bad.event_id)).first() is None


def test_stored_state_answers_what_the_applier_stored(store: Store) -> None:
    w = small_execution(43)
    policy = PolicyPublished(run_id="run-contract", version=3, checkpoint="ckpt/3")
    with store.transaction() as conn:
        apply_events(conn, [*w.events, policy])
    calls = [e for e in w.events if isinstance(e, ModelCall)]
    execution_id = calls[0].execution_id
    assert execution_id is not None
    with store.transaction() as conn:
        state = event_applier(conn).stored_state()
        prior = state.prior_events([calls[0].event_id, policy.event_id, "00000000-0000-4000-8000-000000000000"])
        assert set(prior) == {calls[0].event_id, policy.event_id}
        assert prior[calls[0].event_id][:3] == (calls[0].execution_id, calls[0].seq, "model_call")
        stored = state.stored_event(calls[0].event_id)
        assert stored is not None
        assert stored["kind"] == "model_call"
        assert stored["seq"] == calls[0].seq
        assert state.stored_event("00000000-0000-4000-8000-000000000000") is None
        rows = state.executions([execution_id])
        assert rows[execution_id]["n_calls"] == len(calls)
        out = state.nodes([calls[0].output_node_id])
        assert len(out) == 1
        assert out[0].role in (Role.ACTION, Role.SUMMARY)
        assert out[0].execution_id == execution_id
        assert out[0].length == calls[0].output_ids.size
        roots = state.children(execution_id, None)
        assert len(roots) == 3  # the first prompt and the root of each of the 2 later segments
        boundaries = [e.root_node_id for e in w.events if isinstance(e, SegmentBoundary)]
        assert [nid for nid, _, _ in roots[:2]] == boundaries[::-1]  # most recent first
        assert np.array_equal(state.path_tokens(calls[0].output_node_id),
                              np.concatenate([w.context(calls[0].parent), calls[0].appended, calls[0].output_ids])
                              if calls[0].parent else np.concatenate([calls[0].appended, calls[0].output_ids]))
        digest = digest_bytes(np.ascontiguousarray(calls[0].output_ids).data)
        assert state.stored_spans([digest, b"\x00" * 16]) == {digest}
        assert state.policy_version_exists("run-contract", 3)
        assert not state.policy_version_exists("run-contract", 4)
        assert state.cell("no-such-cell") is None


def test_cells_go_through_the_applier(store: Store) -> None:
    cell = CellRegistered(cell_id="cell-7", tier="core", capacity=8)
    with store.transaction() as conn:
        apply_events(conn, [cell])
    with store.transaction() as conn:
        row = event_applier(conn).stored_state().cell("cell-7")
    assert row is not None
    assert (row["tier"], row["capacity"], row["role"]) == ("core", 8, "idle")


@pytest.mark.postgres
def test_both_dialects_store_the_same_projections(tmp_path: Path, pg_url: str) -> None:
    w = small_execution(44)
    hashes = []
    for url in (f"sqlite:///{tmp_path / 'store.db'}", pg_url):
        store = Store.open(url)
        with store.transaction() as conn:
            apply_events(conn, w.events[: len(w.events) // 2])
        with store.transaction() as conn:
            apply_events(conn, w.events[len(w.events) // 2 :])
        hashes.append(store.projection_hash())
        store.close()
    assert hashes[0] == hashes[1]
