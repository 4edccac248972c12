"""Batch assembly step by step, on hand-made node rows (no store): each named step of ``build_batch``."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from sapwood.learner.assembly import (
    keep_paths,
    leaf_rewards,
    node_layout,
    rollout_logprobs,
    segment_parents,
    select_leaves,
    select_nodes,
    token_parents,
    trainable_tokens,
)
from sapwood.learner.config import SourceConfig
from sapwood.platform.storage.trees import BatchNode, BatchRows
from sapwood.platform.tree import Role


def node(node_id: str, parent: str | None, role: Role, length: int, depth: int, *, segment: int = 0,
         prev: str | None = None, leaf: bool = False, call: str | None = None, ex: str = "e") -> BatchNode:
    return BatchNode(node_id=node_id, execution_id=ex, parent_id=parent, prev_segment_node=prev, role=int(role),
                     span_digest=node_id.encode(), length=length, depth=depth, segment=segment, is_leaf=leaf,
                     call_id=call, policy_version=0 if call else None)


# segment 0: p(prompt 2) -> a(action 3) -> s(summary 2);   segment 1: q(prompt 1, continues s) -> b / c
TREE = [
    node("p", None, Role.PROMPT, 2, 0),
    node("a", "p", Role.ACTION, 3, 2, call="ca"),
    node("s", "a", Role.SUMMARY, 2, 5, call="cs"),
    node("q", None, Role.PROMPT, 1, 0, segment=1, prev="s"),
    node("b", "q", Role.ACTION, 2, 1, segment=1, leaf=True, call="cb"),
    node("c", "q", Role.ACTION, 1, 1, segment=1, leaf=True, call="cc"),
]
BY_ID = {n.node_id: n for n in TREE}


def test_select_leaves_keeps_all_when_they_fit_and_a_seeded_subset_otherwise() -> None:
    leaves = [f"l{i}" for i in range(10)]
    assert select_leaves(leaves[:3], 3, seed=0) == leaves[:3]
    picked = select_leaves(leaves, 4, seed=1)
    assert len(picked) == 4
    assert set(picked) <= set(leaves)
    assert select_leaves(leaves, 4, seed=1) == picked, "the same seed picks the same leaves"
    assert any(select_leaves(leaves, 4, seed=s) != picked for s in range(2, 6)), "the seed matters"


def test_keep_paths_crosses_the_compaction_and_keeps_shared_nodes_once() -> None:
    kept = keep_paths(BY_ID, ["b"])
    assert [n.node_id for n in kept] == ["p", "a", "s", "q", "b"]
    both = keep_paths(BY_ID, ["b", "c"])
    assert [n.node_id for n in both] == ["p", "a", "s", "q", "b", "c"]


def test_select_nodes_skips_excluded_and_unknown_executions() -> None:
    ok = SimpleNamespace(status="success", reward=1.0, score=None, leaf_rewards=None, task_family="math")
    failed = SimpleNamespace(status="error", reward=None, score=None, leaf_rewards=None, task_family="math")
    other = [node("x", None, Role.ACTION, 1, 0, leaf=True, call="cx", ex="f")]
    rows = BatchRows(executions={"e": ok, "f": failed}, nodes={"e": TREE, "f": other})
    sel = select_nodes(rows, ["missing", "f", "e"], SourceConfig(jmax=1))
    assert sel.execution_ids == ["e"]
    assert sel.task_families == ["math"]
    assert set(sel.execution_of_node) == {0}
    assert len(sel.leaf_reward) == 1
    assert set(sel.leaf_reward.values()) == {1.0}


def test_layout_parents_and_segment_links() -> None:
    chosen = keep_paths(BY_ID, ["b", "c"])  # p a s q b c: lengths 2 3 2 1 2 1
    lay = node_layout(chosen)
    assert lay.starts.tolist() == [0, 2, 5, 7, 8, 10]
    assert lay.ends.tolist() == [1, 4, 6, 7, 9, 10]
    assert lay.total == 11
    assert lay.offset_in_node().tolist() == [0, 1, 0, 1, 2, 0, 1, 0, 0, 1, 0]
    parent = token_parents(chosen, lay)
    assert parent.tolist() == [-1, 0, 1, 2, 3, 4, 5, -1, 7, 8, 7]
    seg = segment_parents(chosen, lay)
    assert seg.tolist() == [-1] * 7 + [6] + [-1] * 3, "the segment root's first token continues the summary's last"


@pytest.mark.parametrize("train_summaries", [True, False])
def test_trainable_tokens_follow_the_trainable_role_rule(train_summaries: bool) -> None:
    chosen = keep_paths(BY_ID, ["b"])  # p a s q b
    lay = node_layout(chosen)
    got = trainable_tokens(chosen, lay, train_summaries=train_summaries)
    summary = [train_summaries] * 2
    assert got.tolist() == [False] * 2 + [True] * 3 + summary + [False] + [True] * 2


def test_rollout_logprobs_land_on_their_nodes_and_zero_where_not_trainable() -> None:
    chosen = keep_paths(BY_ID, ["b"])  # p a s q b
    lay = node_layout(chosen)
    spans = {b"lp-" + c.encode(): np.full(n, -0.5 - i, dtype=np.float32).tobytes()
             for i, (c, n) in enumerate([("ca", 3), ("cs", 2), ("cb", 2)])}
    digests = {c: b"lp-" + c.encode() for c in ("ca", "cs", "cb")}
    trainable = trainable_tokens(chosen, lay, train_summaries=False)
    lp = rollout_logprobs(chosen, lay, spans, digests, trainable)
    assert lp.tolist() == [0, 0, -0.5, -0.5, -0.5, 0, 0, 0, -2.5, -2.5]


def test_leaf_rewards_sit_on_each_leafs_last_token_and_nan_elsewhere() -> None:
    chosen = keep_paths(BY_ID, ["b", "c"])
    lay = node_layout(chosen)
    r = leaf_rewards(lay, {"b": 1.0, "c": -1.0, "not-selected": 5.0})
    assert r[9] == 1.0
    assert r[10] == -1.0
    assert int(np.isnan(r).sum()) == 9
