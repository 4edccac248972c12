"""Store contract: the same behaviour on every backend (SQLite and PostgreSQL)."""

from __future__ import annotations

import time

import numpy as np
import pytest
import sqlalchemy as sa

from sapwood.platform import schema as t
from sapwood.platform.errors import (
    ConflictError,
    DigestMismatchError,
    DTypeError,
    SequenceError,
    TokenRangeError,
    UnknownParentError,
    ValidationError,
)
from sapwood.platform.events import ModelCall, PolicyPublished
from sapwood.platform.store import Store
from sapwood.platform.tokens import input_digest
from sapwood.platform.writer import ExecutionWriter
from tests.support.histories import expected_input, small_execution


def _counts(store: Store) -> dict[str, int]:
    with store.transaction() as conn:
        return {
            tb.name: conn.execute(sa.select(sa.func.count()).select_from(tb)).scalar_one()
            for tb in (t.events, t.spans, t.nodes, t.calls, t.executions, t.segments, t.scores)
        }


def test_apply_then_reconstruct_every_input_exactly(store: Store) -> None:
    w = small_execution(1)
    t0 = time.perf_counter()
    result = store.apply(w.events)
    wall = time.perf_counter() - t0
    assert len(result.applied) == len(w.events)
    assert not result.rejected
    assert set(result.timings) == {"lookups", "digests", "plan", "spans", "payloads", "store"}
    assert all(v >= 0 for v in result.timings.values())
    assert sum(result.timings.values()) <= wall
    calls = [e for e in w.events if isinstance(e, ModelCall)]
    assert len(calls) > 10
    for call in calls:
        np.testing.assert_array_equal(store.reconstruct_input(call.call_id), expected_input(w, call))
        ids, lps = store.call_output(call.call_id)
        np.testing.assert_array_equal(ids, call.output_ids)
        np.testing.assert_array_equal(lps, call.output_logprobs)


@pytest.mark.parametrize("vocab", [151_936, 1 << 24, 2**31 - 1])
def test_large_vocabularies_reconstruct_exactly(store: Store, vocab: int) -> None:
    """Ids that need 18 bits, 3 bytes or 4 bytes: stored narrowed, read back exactly, output ids too."""
    rng = np.random.default_rng(vocab % 1000)
    w = ExecutionWriter(run_id="r", task_id="big-vocab", vocab_size=vocab)
    w.start()
    node = w.prompt(rng.integers(0, vocab, 300)).node_id
    calls = []
    for _ in range(5):
        call = w.call(node, rng.integers(0, vocab, 40), rng.integers(vocab - 70_000, vocab, 60), -rng.random(60))
        calls.append(call)
        node = w.observe(call.output_node_id, rng.integers(0, vocab, 200)).node_id
    w.finish("success", reward=1.0)
    store.apply(w.events)
    for call in calls:
        np.testing.assert_array_equal(store.reconstruct_input(call.call_id), expected_input(w, call))
        ids, lps = store.call_output(call.call_id)
        np.testing.assert_array_equal(ids, call.output_ids)
        np.testing.assert_array_equal(lps, call.output_logprobs)
    live = store.projection_hash()
    store.rebuild_projections()
    assert store.projection_hash() == live


def test_duplicate_events_change_nothing(store: Store) -> None:
    w = small_execution(2)
    store.apply(w.events)
    before, counts = store.projection_hash(), _counts(store)
    again = store.apply(w.events)
    assert again.duplicates == len(w.events)
    assert not again.applied
    half = store.apply(w.events[: len(w.events) // 2] + w.events[:3])
    assert half.duplicates == len(w.events) // 2 + 3
    assert store.projection_hash() == before
    assert _counts(store) == counts


def test_duplicate_inside_one_batch_is_applied_once(store: Store) -> None:
    w = small_execution(3)
    result = store.apply(w.events[:5] + w.events[2:4] + w.events[5:])
    assert result.duplicates == 2
    assert len(result.applied) == len(w.events)


def test_reused_event_id_with_other_content_is_a_conflict(store: Store) -> None:
    w = small_execution(4)
    store.apply(w.events)
    other = small_execution(5)
    clash = other.events[0]
    clash.event_id = w.events[1].event_id
    with pytest.raises(ConflictError, match="reuses it with different content"):
        store.apply([clash])


def test_batch_is_atomic(store: Store) -> None:
    good = small_execution(6)
    bad = small_execution(7)
    store.apply(bad.events[:4])
    before, counts = store.projection_hash(), _counts(store)
    call = next(e for e in bad.events[4:] if isinstance(e, ModelCall))
    idx = bad.events.index(call)
    call.input_digest = "0" * 32
    with pytest.raises(DigestMismatchError):
        store.apply(good.events + bad.events[4 : idx + 1])
    assert store.projection_hash() == before
    assert _counts(store) == counts


def test_sequence_gap_and_reuse_are_rejected_with_expectations(store: Store) -> None:
    w = small_execution(8)
    store.apply(w.events[:3])
    with pytest.raises(SequenceError, match=r"sequence gap .* got seq 4, expected 3"):
        store.apply([w.events[4]])
    w2 = small_execution(8)
    w2.execution_id = w.execution_id
    ev = w2.events[2]
    ev.execution_id = w.execution_id
    with pytest.raises(SequenceError, match=r"sequence reuse .* got seq 2, expected 3"):
        store.apply([ev])


def test_events_for_an_unknown_execution_are_rejected(store: Store) -> None:
    w = small_execution(9)
    with pytest.raises(UnknownParentError, match="expected an execution_started event"):
        store.apply(w.events[1:3])


def test_digest_mismatch_names_both_digests(store: Store) -> None:
    w = small_execution(10)
    call_idx = next(i for i, e in enumerate(w.events) if isinstance(e, ModelCall) and e.parent)
    store.apply(w.events[:call_idx])
    call = w.events[call_idx]
    assert isinstance(call, ModelCall)
    recorded = call.input_digest
    call.input_digest = input_digest([1, 2, 3])
    with pytest.raises(DigestMismatchError, match="does not match the input reconstructed") as info:
        store.apply([call])
    assert recorded in str(info.value)


def test_unknown_parent_node(store: Store) -> None:
    w = ExecutionWriter(run_id="r", task_id="t", vocab_size=100)
    w.start()
    root = w.prompt([1, 2, 3])
    store.apply(w.events)
    other = ExecutionWriter(run_id="r", task_id="t", vocab_size=100)
    other.start()
    foreign = other.prompt([5, 6])
    store.apply(other.events)
    call = w.call(root.node_id, [4], [7], [-0.5])
    call.parent = foreign.node_id  # a node of another execution
    with pytest.raises(UnknownParentError, match="is not a node of execution"):
        store.apply([call])


def test_out_of_vocabulary_ids_are_rejected(store: Store) -> None:
    w = ExecutionWriter(run_id="r", task_id="t", vocab_size=10)
    w.start()
    w.prompt([1, 2, 50])
    with pytest.raises(TokenRangeError, match="out of vocabulary"):
        store.apply(w.events)


def test_nothing_after_finish_except_scores(store: Store) -> None:
    w = small_execution(11)
    store.apply(w.events)
    late = w.score(0.7, scorer="late-grader")
    assert store.apply([late]).applied
    from sapwood.platform.events import Prompt

    stray = Prompt(execution_id=w.execution_id, seq=late.seq + 1, parent=None, token_ids=[1])  # type: ignore[operator]
    with pytest.raises(SequenceError, match="only partial_score events may follow"):
        store.apply([stray])


def test_partial_score_revisions_in_order(store: Store) -> None:
    w = small_execution(12, status="timeout")
    store.apply(w.events)
    with store.transaction() as conn:
        row = conn.execute(sa.select(t.executions).where(t.executions.c.execution_id == w.execution_id)).one()
    assert row.status == "timeout"
    assert row.reward is None
    assert row.score is not None
    assert row.score_revision == 0
    w.score(0.9, scorer="regrade")
    assert store.apply(w.events[-1:]).applied
    skip = w.score(0.1)
    skip.revision = 5
    with pytest.raises(SequenceError, match=r"revision 5 .* expected 2"):
        store.apply([skip])


def test_spans_are_shared_across_executions(store: Store) -> None:
    store.apply(small_execution(13).events)
    with store.transaction() as conn:
        spans_one = conn.execute(sa.select(sa.func.count()).select_from(t.spans)).scalar_one()
    store.apply(small_execution(14).events)
    with store.transaction() as conn:
        spans_two = conn.execute(sa.select(sa.func.count()).select_from(t.spans)).scalar_one()
        system_nodes = conn.execute(
            sa.select(sa.func.count(sa.distinct(t.nodes.c.span_digest))).where(t.nodes.c.depth == 0,
                                                                                 t.nodes.c.segment == 0)
        ).scalar_one()
    assert system_nodes == 1, "both executions' system prompt nodes point at one span"
    assert spans_two < 2 * spans_one


def test_collect_mode_rejects_bad_events_and_applies_the_rest(store: Store) -> None:
    a, b = small_execution(15), small_execution(16)
    call = next(e for e in a.events if isinstance(e, ModelCall))
    call.input_digest = "f" * 32
    result = store.apply(a.events + b.events, strict=False)
    reasons = {r.error.reason for r in result.rejected}
    assert reasons <= {"digest_mismatch", "sequence"}
    assert "digest_mismatch" in reasons
    assert all(r.event.execution_id == a.execution_id for r in result.rejected)
    assert {e.event_id for e in result.applied} >= {e.event_id for e in b.events}


BAD_NUMBERS = {
    "nan log-prob": ("output_logprobs", np.array([-0.5, np.nan], np.float32), DTypeError, "finite log-probabilities"),
    "positive log-prob": ("output_logprobs", np.array([-0.5, 0.5], np.float32), DTypeError, "finite"),
    "-inf log-prob": ("output_logprobs", np.array([-np.inf, -0.5], np.float32), DTypeError, "finite"),
    "negative id": ("output_ids", np.array([5, -3], np.int32), TokenRangeError, "must be ≥ 0"),
    "id beyond vocabulary": ("appended", np.array([4, 100], np.int32), TokenRangeError, "out of vocabulary"),
}


def test_bad_numbers_in_a_batch_are_rejected_and_the_rest_applied(store: Store) -> None:
    """Each event with a bad value is rejected for it (the batch-wide checks flag the right array);
    the good events around it, before and after, are all applied."""
    good_before, good_after = small_execution(21), small_execution(22)
    bad: dict[str, tuple[ModelCall, type[Exception], str]] = {}
    events = list(good_before.events)
    for case, (field, values, error, message) in BAD_NUMBERS.items():
        w = ExecutionWriter(run_id="r", task_id=case, vocab_size=100)
        w.start()
        root = w.prompt([1, 2, 3])
        call = w.call(root.node_id, [4, 5], [6, 7], [-0.1, -0.2])
        setattr(call, field, values)
        bad[case] = (call, error, message)
        events += w.events
    events += good_after.events
    result = store.apply(events, strict=False)
    by_id = {r.event.event_id: r.error for r in result.rejected}
    assert len(by_id) == len(bad)
    for case, (call, error, message) in bad.items():
        assert isinstance(by_id[call.event_id], error), case
        assert message in str(by_id[call.event_id]), case
    applied = {e.event_id for e in result.applied}
    assert applied >= {e.event_id for e in good_before.events + good_after.events}
    assert len(applied) == len(events) - len(bad)


def test_full_token_inputs_share_existing_nodes(store: Store) -> None:
    w = ExecutionWriter(run_id="r", task_id="t", vocab_size=1000)
    w.start()
    sys_node = w.prompt(np.arange(50) % 1000).node_id
    first = w.call(sys_node, [7, 8], [9, 10, 11], [-0.1, -0.2, -0.3])
    obs = w.observe(first.output_node_id, [12, 13])
    full = [*w.context(obs.node_id).tolist(), 14]
    ev = ModelCall(execution_id=w.execution_id, seq=w._seq + 1, parent=None, appended=full,
                   input_digest=input_digest(full), output_ids=[15], output_logprobs=[-0.4])
    store.apply([*w.events, ev])
    np.testing.assert_array_equal(store.reconstruct_input(ev.call_id), full)
    with store.transaction() as conn:
        n_tokens = conn.execute(sa.select(t.executions.c.n_tokens)).scalar_one()
    assert n_tokens == len(full) + 1, "only the new token and the output were added to the tree"


def test_policy_versions(store: Store) -> None:
    store.apply([PolicyPublished(run_id="r", version=1, checkpoint="ckpt/1")])
    with pytest.raises(ConflictError, match="already published"):
        store.apply([PolicyPublished(run_id="r", version=1)])


def test_rebuild_is_identical(store: Store) -> None:
    for seed in range(17, 20):
        store.apply(small_execution(seed, status="timeout" if seed % 2 else "success").events)
    store.apply([PolicyPublished(run_id="synthetic", version=3)])
    live = store.projection_hash()
    assert store.rebuild_projections() > 0
    assert store.projection_hash() == live


def test_validation_errors_are_sapwood_errors(store: Store) -> None:
    w = small_execution(20)
    w.events[0].schema_version = 7
    with pytest.raises(ValidationError, match="unknown schema version 7"):
        store.apply(w.events[:1])


def test_rejected_events_leave_no_trace(store: Store) -> None:
    """Collect mode, one batch: each kind of event a handler refuses after its own look-ups (a segment from an
    action node, a fork or leaf reward at an unknown node, a digest mismatch, a skipped score revision, a parent
    from another execution) is rejected for its reason and leaves nothing behind: the live projections equal a
    rebuild from the stored events, and the refused call's spans are not stored."""
    from sapwood.platform.events import ExecutionFinished, Fork, Observation, PartialScore, SegmentBoundary
    from sapwood.platform.tokens import digest_bytes, pack

    nowhere = "00000000-0000-4000-8000-0000000000ff"
    other = ExecutionWriter(run_id="r", task_id="other", vocab_size=20_000)
    other.start()
    foreign = other.prompt([1, 2, 3])
    events = list(other.events)
    bad: dict[str, tuple[object, type[Exception]]] = {}

    def make(case: str) -> tuple[ExecutionWriter, ModelCall]:
        w = ExecutionWriter(run_id="r", task_id=case, vocab_size=20_000)
        w.start()
        call = w.call(w.prompt([4, 5, 6]).node_id, [7], [8, 9], [-0.1, -0.2])
        return w, call

    def last(w: ExecutionWriter, ev: object, case: str, error: type[Exception]) -> None:
        ev.execution_id, ev.seq = w.execution_id, len(w.events)  # type: ignore[attr-defined]
        events.extend([*w.events, ev])  # type: ignore[list-item]
        bad[case] = (ev, error)

    w, call = make("segment from an action")
    last(w, SegmentBoundary(from_node=call.output_node_id, token_ids=[1, 2]), "segment from an action", ValidationError)
    w, call = make("fork nowhere")
    last(w, Fork(at_node=nowhere, branches=2), "fork nowhere", UnknownParentError)
    w, call = make("leaf reward nowhere")
    last(w, ExecutionFinished(status="success", reward=1.0, leaf_rewards={nowhere: 1.0}), "leaf reward nowhere",
         UnknownParentError)
    w, call = make("score skips a revision")
    last(w, PartialScore(score=0.3, revision=5), "score skips a revision", SequenceError)
    w, call = make("foreign parent")
    last(w, Observation(parent=foreign.node_id, token_ids=[1, 2]), "foreign parent", UnknownParentError)
    w, call = make("digest mismatch")
    unique = np.arange(19_000, 19_040, dtype=np.int32)
    wrong = w.call(call.output_node_id, [3], unique, np.full(unique.size, -0.5, np.float32))
    w.events.pop()
    wrong.input_digest = "f" * 32
    last(w, wrong, "digest mismatch", DigestMismatchError)

    result = store.apply(events, strict=False)
    refused = {r.event.event_id: r.error for r in result.rejected}
    assert len(refused) == len(bad)
    assert len(result.applied) == len(events) - len(bad)
    for case, (ev, error) in bad.items():
        assert isinstance(refused[ev.event_id], error), case  # type: ignore[attr-defined]
    live = store.projection_hash()
    store.rebuild_projections()
    assert store.projection_hash() == live, "a refused event changed a projection"
    with store.transaction() as conn:
        stored = {bytes(d) for (d,) in conn.execute(sa.select(t.spans.c.digest))}
        kept = set(conn.execute(sa.select(t.events.c.event_id)).scalars())
    assert digest_bytes(pack(unique)) not in stored, "the refused call's output was stored"
    assert not kept & set(refused)
