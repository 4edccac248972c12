"""Full-token model calls (``parent=None``) land where the recorder's delta would: right segment, right parent."""

from __future__ import annotations

import numpy as np
import pytest
import sqlalchemy as sa

from sapwood.platform import schema as t
from sapwood.platform.events import ModelCall
from sapwood.platform.store import Store
from sapwood.platform.tokens import input_digest
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
