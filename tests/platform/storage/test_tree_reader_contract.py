"""Tree reader contract (:mod:`sapwood.platform.storage.trees`): the same answers on SQLite and PostgreSQL.

One hand-built execution: a prompt, two compactions (three segments), a summary call with no appended
input, and a second context root that nothing follows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import sqlalchemy as sa

from sapwood.platform.errors import UnknownParentError
from sapwood.platform.events import ModelCall
from sapwood.platform.storage.backends import tree_reader
from sapwood.platform.storage.trees import PageSlice
from sapwood.platform.store import Store
from sapwood.platform.tree import Role
from sapwood.platform.writer import ExecutionWriter
from tests.support.histories import expected_input

MISSING = "00000000-0000-4000-8000-000000000000"


def _lps(n: int, start: float) -> np.ndarray:
    return -(start + np.arange(n, dtype=np.float32) / 8)


@dataclass
class Tree:
    w: ExecutionWriter
    path: list[str]
    """Node ids of the logical path to the last call's output, root first."""
    segments: list[int]
    summaries: list[str]
    lonely: str
    last: ModelCall


@pytest.fixture
def tree(store: Store) -> Tree:
    w = ExecutionWriter(run_id="tree-contract", task_id="t", vocab_size=1000)
    w.start()
    p = w.prompt([1, 2, 3, 4])
    c1 = w.call(p.node_id, [5, 6], [7, 8, 9], _lps(3, 0.1))
    s1 = w.call(c1.output_node_id, [10], [11, 12], _lps(2, 0.2), kind="summary")
    b1 = w.compact(s1.output_node_id, [100, 101, 11, 12])
    c2 = w.call(b1.root_node_id, [13], [14, 15], _lps(2, 0.3))
    s2 = w.call(c2.output_node_id, [], [16], _lps(1, 0.4), kind="summary")  # no appended input: no input node
    b2 = w.compact(s2.output_node_id, [200, 16])
    c3 = w.call(b2.root_node_id, [17], [18, 19, 20], _lps(3, 0.5))
    lonely = w.prompt([9, 9])
    w.finish("success", reward=1.0)
    store.apply(w.events)
    ids = (p.node_id, c1.input_node_id, c1.output_node_id, s1.input_node_id, s1.output_node_id,
           b1.root_node_id, c2.input_node_id, c2.output_node_id, s2.output_node_id,
           b2.root_node_id, c3.input_node_id, c3.output_node_id)
    path = [nid for nid in ids if nid is not None]
    assert len(path) == len(ids)
    return Tree(w, path, [0] * 5 + [1] * 4 + [2] * 3, [s1.output_node_id, s2.output_node_id], lonely.node_id, c3)


def test_the_logical_path_crosses_two_compactions(store: Store, tree: Tree) -> None:
    w = tree.w
    with store.transaction() as conn:
        reader = tree_reader(conn)
        path = reader.logical_path(conn, tree.last.output_node_id)
        pages = reader.token_pages(conn, [PageSlice(p.span_digest, None, 0, p.length) for p in path])
        context = reader.context(conn, tree.last.output_node_id)
        context_tokens = reader.context_tokens(conn, tree.last.output_node_id)
    assert [p.node_id for p in path] == tree.path
    assert [p.segment for p in path] == tree.segments
    assert {p.execution_id for p in path} == {w.execution_id}
    # each node's logical parent is the node before it; segment roots continue the summaries
    assert [p.up for p in path] == [None, *tree.path[:-1]]
    assert [p.prev_segment_node for p in path if p.parent_id is None] == [None, *tree.summaries]
    lengths = [p.length for p in path]
    assert [p.offset for p in path] == np.concatenate([[0], np.cumsum(lengths)[:-1]]).tolist()
    expected = np.concatenate([w.context(tree.summaries[0]), w.context(tree.summaries[1]),
                               w.context(tree.last.output_node_id)])
    np.testing.assert_array_equal(np.concatenate([pg.token_ids for pg in pages]), expected)
    assert path[-1].offset + path[-1].length == expected.size
    # the context stops at its segment's root; its tokens are the last segment's alone
    assert [n.node_id for n in context] == tree.path[-3:]
    assert [n.depth for n in context] == [0, 2, 3]
    np.testing.assert_array_equal(context_tokens, w.context(tree.last.output_node_id))
    assert b"".join(n.data for n in context) == np.asarray(context_tokens, dtype="<i4").tobytes()


def test_levels_and_child_counts_follow_the_logical_parent(store: Store, tree: Tree) -> None:
    with store.transaction() as conn:
        reader = tree_reader(conn)
        nodes = reader.nodes(conn, tree.w.execution_id)
        single = {nid: reader.node(conn, nid)[0] for nid in (*tree.path, tree.lonely)}
    by_id = {n.node_id: n for n in nodes}
    assert [n.node_id for n in nodes] == [*tree.path, tree.lonely]  # creation order, parents first
    assert [by_id[nid].level for nid in tree.path] == list(range(len(tree.path)))
    assert [by_id[nid].n_children for nid in tree.path] == [1] * (len(tree.path) - 1) + [0]
    assert [by_id[nid].is_leaf for nid in tree.path] == [False] * (len(tree.path) - 1) + [True]
    for nid, one in single.items():
        assert (one.level, one.n_children, one.is_leaf) == (by_id[nid].level, by_id[nid].n_children, by_id[nid].is_leaf)
    assert Role(by_id[tree.path[2]].role) is Role.ACTION
    assert by_id[tree.summaries[0]].role == Role.SUMMARY


def test_a_root_with_no_children(store: Store, tree: Tree) -> None:
    with store.transaction() as conn:
        reader = tree_reader(conn)
        node, digest = reader.node(conn, tree.lonely)
        path = reader.logical_path(conn, tree.lonely)
        roots = reader.segment_roots(conn, tree.w.execution_id)
        listed = reader.segment_roots(conn, tree.w.execution_id, reader.nodes(conn, tree.w.execution_id))
        (page,) = reader.token_pages(conn, [PageSlice(digest, None, 0, node.length)])
    assert (node.level, node.n_children, node.is_leaf, node.parent_id, node.up) == (0, 0, True, None, None)
    assert [(p.node_id, p.offset, p.length) for p in path] == [(tree.lonely, 0, 2)]
    assert roots == listed  # read from the segments table alone, or with the tree already listed
    assert [(r["segment"], r["root_node"], r["from_node"]) for r in roots] == [
        (0, tree.path[0], None), (1, tree.path[5], tree.summaries[0]), (2, tree.path[9], tree.summaries[1]),
        (0, tree.lonely, None)]
    assert page.token_ids.tolist() == [9, 9]
    assert page.logprobs is None


def test_pages_at_the_path_end(store: Store, tree: Tree) -> None:
    last = tree.last
    with store.transaction() as conn:
        reader = tree_reader(conn)
        end = reader.logical_path(conn, last.output_node_id)[-1]
        whole, tail, empty, no_call = reader.token_pages(conn, [
            PageSlice(end.span_digest, last.call_id, 0, end.length),
            PageSlice(end.span_digest, last.call_id, end.length - 1, end.length),
            PageSlice(end.span_digest, last.call_id, end.length, end.length),  # exactly at the path's end
            PageSlice(end.span_digest, None, 1, end.length),
        ])
    np.testing.assert_array_equal(whole.token_ids, last.output_ids)
    assert whole.logprobs is not None
    assert whole.logprobs.dtype == np.float32
    np.testing.assert_array_equal(whole.logprobs, last.output_logprobs)
    assert tail.token_ids.tolist() == [20]
    assert tail.logprobs is not None
    np.testing.assert_array_equal(tail.logprobs, last.output_logprobs[-1:])
    assert empty.token_ids.size == 0
    assert empty.logprobs is not None
    assert empty.logprobs.size == 0
    assert no_call.token_ids.tolist() == [19, 20]
    assert no_call.logprobs is None
    with store.transaction() as conn:
        assert tree_reader(conn).token_pages(conn, []) == []


def test_the_node_prefix_on_its_boundaries(store: Store, tree: Tree) -> None:
    eid = tree.w.execution_id
    with store.transaction() as conn:
        reader = tree_reader(conn)
        whole = reader.nodes(conn, eid)
        exact = reader.node_prefix(conn, eid, len(whole), None)
        first = reader.node_prefix(conn, eid, 1, None)
        level0 = reader.node_prefix(conn, eid, len(whole), 0)
        level_last = reader.node_prefix(conn, eid, len(whole), len(tree.path) - 1)
    assert exact == whole  # same records: ids, levels and child counts
    assert [(n.node_id, n.n_children) for n in first] == [(tree.path[0], 1)]  # children counted over the whole tree
    assert [n.node_id for n in level0] == [tree.path[0], tree.lonely]
    assert level_last == whole


def test_call_inputs_rebuild_from_the_tree(store: Store, tree: Tree) -> None:
    calls = [e for e in tree.w.events if isinstance(e, ModelCall)]
    with store.transaction() as conn:
        reader = tree_reader(conn)
        for call in calls:
            ids, recorded = reader.call_input(conn, call.call_id)
            np.testing.assert_array_equal(ids, expected_input(tree.w, call))
            assert recorded == ids.size


def test_batch_rows_and_execution_spans(store: Store, tree: Tree) -> None:
    w = tree.w
    calls = [e for e in w.events if isinstance(e, ModelCall)]
    with store.transaction() as conn:
        reader = tree_reader(conn)
        rows = reader.batch_rows(conn, [w.execution_id, MISSING])
        tokens, logprobs = reader.execution_spans(conn, w.execution_id)
        facts = reader.leaf_facts(conn, tree.last.output_node_id)
        inner = reader.leaf_facts(conn, tree.path[0])
    assert set(rows.executions) == {w.execution_id}
    assert set(rows.nodes) == {w.execution_id}
    assert rows.executions[w.execution_id].status == "success"
    batch = {n.node_id: n for n in rows.nodes[w.execution_id]}
    assert set(batch) == {*tree.path, tree.lonely}
    assert [batch[nid].is_leaf for nid in (tree.path[-1], tree.path[-2], tree.lonely)] == [True, False, True]
    assert {batch[nid].call_id for nid in tree.path[-1:]} == {tree.last.call_id}
    assert set(rows.logprob_digests) == {c.call_id for c in calls}
    assert set(tokens) == set(w.nodes)
    assert all(np.array_equal(tokens[k], v.tokens) for k, v in w.nodes.items())
    assert set(logprobs) == {c.output_node_id for c in calls}
    for c in calls:
        np.testing.assert_array_equal(logprobs[c.output_node_id], c.output_logprobs)
    assert facts is not None
    assert facts["is_leaf"]
    assert facts["status"] == "success"
    assert facts["reward"] == 1.0
    assert inner is not None
    assert not inner["is_leaf"]


def test_unknown_ids_are_named_in_the_error(store: Store, tree: Tree) -> None:
    with store.transaction() as conn:
        reader = tree_reader(conn)
        for read in (reader.logical_path, reader.context, reader.context_tokens, reader.node):
            with pytest.raises(UnknownParentError, match=f"^node {MISSING} does not exist$"):
                read(conn, MISSING)
        with pytest.raises(UnknownParentError, match=f"^model call {MISSING} does not exist$"):
            reader.call_input(conn, MISSING)
        assert reader.leaf_facts(conn, MISSING) is None
        assert reader.nodes(conn, MISSING) == []
        assert reader.segment_roots(conn, MISSING) == []
        empty = reader.batch_rows(conn, [MISSING])
    assert (empty.executions, empty.nodes, empty.logprob_digests) == ({}, {}, {})


def test_the_factory_picks_by_dialect(store: Store) -> None:
    assert type(tree_reader(store.engine)) is type(tree_reader(store.engine.dialect.name))
    assert tree_reader("sqlite") is tree_reader(sa.create_engine("sqlite://"))  # one instance, statements built once
    with pytest.raises(ValueError, match="no tree reader for dialect 'mysql'; expected 'sqlite' or 'postgresql'"):
        tree_reader("mysql")
