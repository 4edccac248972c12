"""Full-token model calls (``parent=None``) land where the recorder's delta would: right segment, right parent."""

from __future__ import annotations

import numpy as np
import pytest
import sqlalchemy as sa

from sapwood.platform import schema as t
from sapwood.platform.events import ModelCall
from sapwood.platform.store import Store
from sapwood.platform.tokens import input_digest
from sapwood.platform.tree.prefix import MAX_COMPARISONS, match_prefix
from sapwood.platform.writer import ExecutionWriter


def _compacted() -> tuple[ExecutionWriter, str, str]:
    """An execution with one compaction: (writer, last node of segment 0, last node of segment 1)."""
    w = ExecutionWriter(run_id="r", task_id="t", vocab_size=1000)
    w.start()
    task = np.arange(100, 120, dtype=np.int32)
    root = w.prompt(np.concatenate([np.arange(30, dtype=np.int32), task])).node_id
    act = w.call(root, [1, 2], [3, 4, 5], [-0.1, -0.2, -0.3])
    obs0 = w.observe(act.output_node_id, [6, 7, 8]).node_id
    summary = w.call(obs0, [9], [10, 11], [-0.5, -0.6], kind="summary")
    seg_root = w.compact(summary.output_node_id, np.concatenate([task, [10, 11]])).root_node_id
    act1 = w.call(seg_root, [12], [13, 14], [-0.1, -0.1])
    obs1 = w.observe(act1.output_node_id, [15, 16]).node_id
    return w, obs0, obs1


def _full_call(w: ExecutionWriter, after: str, extra: list[int]) -> ModelCall:
    full = np.concatenate([w.context(after), np.array(extra, dtype=np.int32)])
    return ModelCall(execution_id=w.execution_id, seq=w._seq + 1, parent=None, appended=full,
                     input_digest=input_digest(full), output_ids=[17, 18], output_logprobs=[-0.2, -0.3])


@pytest.mark.parametrize("segment", [1, 0])
def test_full_token_call_lands_where_the_delta_would(store: Store, segment: int) -> None:
    w, obs0, obs1 = _compacted()
    after = obs1 if segment == 1 else obs0
    call = _full_call(w, after, [19, 20])
    expected_parent, matched = w.longest_prefix_node(call.appended)
    assert expected_parent == after, "the recorder would send a delta"
    assert matched == w.context_length(after), "the recorder would send a delta"
    store.apply([*w.events, call])
    with store.transaction() as conn:
        row = conn.execute(sa.select(t.calls).where(t.calls.c.call_id == call.call_id)).mappings().one()
        input_node = conn.execute(sa.select(t.nodes).where(t.nodes.c.node_id == row["input_node"])).mappings().one()
        n_tokens = conn.execute(sa.select(t.executions.c.n_tokens)).scalar_one()
        tree_before = sum(int(e.n_tokens()) for e in w.events if e.kind != "model_call") + sum(
            int(e.appended.size + e.output_ids.size) for e in w.events if isinstance(e, ModelCall))
    assert row["segment"] == segment
    assert str(input_node["parent_id"]) == after
    assert input_node["length"] == 2
    assert input_node["segment"] == segment
    assert row["input_len"] == call.appended.size
    np.testing.assert_array_equal(store.reconstruct_input(call.call_id), call.appended)
    assert n_tokens == tree_before + 2 + 2, "only the two new input tokens and the output were added"
    before = store.projection_hash()
    store.rebuild_projections()
    assert store.projection_hash() == before


def test_full_token_call_of_exactly_a_stored_context_adds_no_input_node(store: Store) -> None:
    w, _obs0, obs1 = _compacted()
    call = _full_call(w, obs1, [])
    store.apply([*w.events, call])
    with store.transaction() as conn:
        row = conn.execute(sa.select(t.calls).where(t.calls.c.call_id == call.call_id)).mappings().one()
    assert str(row["input_node"]) == obs1
    assert row["segment"] == 1
    np.testing.assert_array_equal(store.reconstruct_input(call.call_id), call.appended)


def test_full_token_call_in_the_same_batch_as_the_compaction(store: Store) -> None:
    """The segment root and its children exist only in the batch's plan, not yet in the store."""
    w, _obs0, obs1 = _compacted()
    call = _full_call(w, obs1, [21])
    store.apply(w.events[:3])
    store.apply([*w.events[3:], call])
    with store.transaction() as conn:
        row = conn.execute(sa.select(t.calls).where(t.calls.c.call_id == call.call_id)).mappings().one()
    assert row["segment"] == 1
    np.testing.assert_array_equal(store.reconstruct_input(call.call_id), call.appended)


# -- siblings that share tokens: the placement backtracks to the longest match over the whole tree ----------

def _placed(store: Store, w: ExecutionWriter, call: ModelCall) -> tuple[dict[str, object], int, int]:
    """Apply ``w``'s events and ``call``: (the call's input node row, execution tokens before, after)."""
    store.apply(w.events)
    with store.transaction() as conn:
        before = conn.execute(sa.select(t.executions.c.n_tokens)).scalar_one()
    store.apply([call])
    with store.transaction() as conn:
        row = conn.execute(sa.select(t.calls).where(t.calls.c.call_id == call.call_id)).mappings().one()
        node = dict(conn.execute(sa.select(t.nodes).where(t.nodes.c.node_id == row["input_node"])).mappings().one())
        after = conn.execute(sa.select(t.executions.c.n_tokens)).scalar_one()
    node["call_segment"] = row["segment"]
    np.testing.assert_array_equal(store.reconstruct_input(call.call_id), call.appended)
    return node, int(before), int(after)


def _siblings(w: ExecutionWriter, at: str, older: list[int], newer: list[int]) -> tuple[ModelCall, ModelCall]:
    """A fork at ``at`` into two calls appending ``older`` then ``newer`` (outputs [20] and [30])."""
    w.fork(at, 2)
    return (w.call(at, older, [20], [-0.1]), w.call(at, newer, [30], [-0.2]))


@pytest.mark.parametrize("segment", [0, 1])
@pytest.mark.parametrize("newer", [[40, 41], [40]], ids=["identical", "prefix"])
def test_a_sibling_sharing_tokens_does_not_capture_the_call(store: Store, segment: int, newer: list[int]) -> None:
    """The older branch appends [40, 41]; the newer one the same tokens (``identical``: a greedy walk, most
    recent sibling first and no backtracking, misses the older branch) or a prefix of them (``prefix``):
    the call continues the older one's output, the longest match. In segment 1 the fork is inside a
    compacted segment."""
    w, obs0, obs1 = _compacted()
    older, _ = _siblings(w, obs1 if segment else obs0, [40, 41], newer)
    call = _full_call(w, older.output_node_id, [50])
    node, before, after = _placed(store, w, call)
    assert str(node["parent_id"]) == older.output_node_id
    assert node["length"] == 1
    assert node["call_segment"] == segment
    assert after - before == 1 + 2, "only the new input token and the output are stored"


def test_equal_matches_go_to_the_most_recent_branch(store: Store) -> None:
    """Two branches whose whole contexts are equal: the documented tie rule picks the most recent one."""
    w, _, obs1 = _compacted()
    _, newer = _siblings(w, obs1, [40, 41], [40, 41])
    tie = w.observe(newer.output_node_id, [60])
    older_obs = w.observe(w.events[-3].output_node_id, [60])  # type: ignore[attr-defined]
    assert list(w.context(older_obs.node_id)) != list(w.context(tie.node_id)), "outputs differ: no tie yet"
    call = _full_call(w, newer.input_node_id or "", [])
    node, _, _ = _placed(store, w, call)
    assert str(node["node_id"]) == newer.input_node_id, "no new input node: the newest equal match"


def test_many_identical_siblings_cannot_make_one_placement_unbounded() -> None:
    """10 identical siblings per level, 8 levels (10**8 chains), and an input that ends differently:
    the search stops after MAX_COMPARISONS comparisons with the longest match it found."""
    calls = 0

    def children(parent: str | None) -> list[tuple[str, int]]:
        depth = 0 if parent is None else parent.count("/")
        return [] if depth == 8 else [(f"{parent or ''}/{i}", 1) for i in range(10)]

    def matches(node_id: str, offset: int, length: int) -> bool:
        nonlocal calls
        calls += 1
        return True  # every node holds the token the input has next

    node, matched = match_prefix(children, matches, 9)  # one token more than the deepest chain
    assert matched == 8
    assert node == "/0" * 8, "the first (most recent) chain of the longest length"
    assert calls <= MAX_COMPARISONS
