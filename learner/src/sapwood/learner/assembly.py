"""Batch assembly: the Jmax-bounded subtrees of claimed executions as one :class:`TreeBatch`.

:func:`build_batch` selects at most Jmax leaves (trajectories) per execution and turns the union of
their root-to-leaf paths — across compaction segments — into one batch of unique tokens. It runs in
named steps, each a function of its own:

1. :func:`select_leaves` — at most Jmax leaves of one execution, chosen uniformly with a seed;
2. :func:`keep_paths` — the nodes on the logical paths of those leaves (each node once);
3. :func:`select_nodes` — steps 1–2 over every execution, with each kept leaf's reward;
4. :func:`node_layout` — where each selected node's tokens sit in the batch;
5. :func:`token_parents`, :func:`segment_parents`, :func:`trainable_tokens`, :func:`rollout_logprobs`,
   :func:`leaf_rewards` — the batch's per-token columns, with numpy over whole nodes (no Python loop
   per token).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from sqlalchemy.engine import Connection

from sapwood.learner.batch import TreeBatch
from sapwood.learner.config import SourceConfig, check_jmax
from sapwood.platform.storage.backends import tree_reader
from sapwood.platform.storage.spans import load_spans
from sapwood.platform.storage.trees import BatchNode, BatchRows
from sapwood.platform.store import Store
from sapwood.platform.tokens import LOGPROB_DTYPE, TOKEN_DTYPE
from sapwood.platform.tree import logical_parent, resolve_reward, trainable_roles

__all__ = [
    "NodeLayout",
    "NodeSelection",
    "build_batch",
    "keep_paths",
    "leaf_rewards",
    "node_layout",
    "rollout_logprobs",
    "segment_parents",
    "select_leaves",
    "select_nodes",
    "token_parents",
    "trainable_tokens",
]


def select_leaves(leaves: Sequence[str], jmax: int, seed: int) -> list[str]:
    """At most ``jmax`` of ``leaves``: all of them when they fit, else the ``jmax`` first by a seeded hash."""
    check_jmax(jmax)
    if len(leaves) <= jmax:
        return list(leaves)
    key = {leaf: hashlib.blake2b(f"{seed}:{leaf}".encode(), digest_size=8).digest() for leaf in leaves}
    return sorted(leaves, key=key.__getitem__)[:jmax]


def keep_paths(nodes: Mapping[str, BatchNode], leaves: Sequence[str]) -> list[BatchNode]:
    """The nodes on the logical paths (root to leaf, across segments) of ``leaves``, each once, ordered by
    ``(segment, depth, node_id)`` (parents before children)."""
    keep: set[str] = set()
    for leaf in leaves:
        cur: str | None = leaf
        while cur is not None and cur not in keep:
            keep.add(cur)
            row = nodes[cur]
            cur = logical_parent(row.parent_id, row.prev_segment_node)
    return sorted((nodes[n] for n in keep), key=lambda r: (r.segment, r.depth, r.node_id))


@dataclass
class NodeSelection:
    """The nodes a batch holds: per execution in topological order, with what each token needs."""

    nodes: list[BatchNode] = field(default_factory=list)
    execution_of_node: list[int] = field(default_factory=list)
    """Index into ``execution_ids`` of each node's execution."""
    execution_ids: list[str] = field(default_factory=list)
    """Executions that contributed nodes (claimed ones the reward policy excludes are absent)."""
    task_families: list[str] = field(default_factory=list)
    leaf_reward: dict[str, float] = field(default_factory=dict)
    """Selected leaf node id → the reward it is trained on."""


def select_nodes(rows: BatchRows, execution_ids: Sequence[str], config: SourceConfig) -> NodeSelection:
    """Jmax leaves and their paths of every execution the reward policy trains on, in ``execution_ids`` order."""
    out = NodeSelection()
    for eid in execution_ids:
        ex = rows.executions.get(eid)
        if ex is None or eid not in rows.nodes:
            continue
        if resolve_reward(ex.status, ex.reward, ex.score, policy=config.reward).reward is None:
            continue
        nodes = {r.node_id: r for r in rows.nodes[eid]}
        leaves = select_leaves(sorted(n for n, r in nodes.items() if r.is_leaf), config.jmax, config.seed)
        for leaf in leaves:
            resolved = resolve_reward(ex.status, ex.reward, ex.score, ex.leaf_rewards, leaf, policy=config.reward)
            assert resolved.reward is not None  # the execution is not excluded, so neither is its leaf
            out.leaf_reward[leaf] = resolved.reward
        kept = keep_paths(nodes, leaves)
        out.nodes.extend(kept)
        out.execution_of_node.extend([len(out.execution_ids)] * len(kept))
        out.execution_ids.append(eid)
        out.task_families.append(ex.task_family)
    return out


@dataclass(frozen=True)
class NodeLayout:
    """Where ``n`` nodes' tokens sit in a batch of ``total`` tokens (nodes laid out back to back)."""

    lengths: np.ndarray
    """[n] int64 tokens per node."""
    starts: np.ndarray
    """[n] int64 index of each node's first token."""
    ends: np.ndarray
    """[n] int64 index of each node's last token."""
    node_of_token: np.ndarray
    """[total] int64 node index of each token."""
    index: dict[str, int]
    """node id → node index."""

    @property
    def total(self) -> int:
        return int(self.node_of_token.size)

    def offset_in_node(self) -> np.ndarray:
        """[total] int64 position of each token within its node."""
        return np.arange(self.total, dtype=np.int64) - self.starts[self.node_of_token]


def node_layout(nodes: Sequence[BatchNode]) -> NodeLayout:
    """Lay ``nodes`` (non-empty lengths) out back to back in their order."""
    n = len(nodes)
    lengths = np.fromiter((r.length for r in nodes), dtype=np.int64, count=n)
    starts = np.zeros(n, dtype=np.int64)
    if n:
        np.cumsum(lengths[:-1], out=starts[1:])
    return NodeLayout(lengths=lengths, starts=starts, ends=starts + lengths - 1,
                      node_of_token=np.repeat(np.arange(n, dtype=np.int64), lengths),
                      index={r.node_id: i for i, r in enumerate(nodes)})


def _node_links(layout: NodeLayout, link: Sequence[str | None]) -> np.ndarray:
    return np.array([layout.index[x] if x else -1 for x in link], dtype=np.int64)


def token_parents(nodes: Sequence[BatchNode], layout: NodeLayout) -> np.ndarray:
    """[total] int64 context parent of each token: the previous token in its node, the parent node's last
    token at a node's first token, -1 at a context root."""
    parent_node = _node_links(layout, [r.parent_id for r in nodes])
    parent = np.arange(layout.total, dtype=np.int64) - 1
    parent[layout.starts] = np.where(parent_node >= 0, layout.ends[parent_node], -1)
    return parent


def segment_parents(nodes: Sequence[BatchNode], layout: NodeLayout) -> np.ndarray:
    """[total] int64: at a segment root's first token, the last token of the summary it continues; else -1."""
    seg_parent_node = _node_links(layout, [r.prev_segment_node for r in nodes])
    segment_parent = np.full(layout.total, -1, dtype=np.int64)
    linked = seg_parent_node >= 0
    segment_parent[layout.starts[linked]] = layout.ends[seg_parent_node[linked]]
    return segment_parent


def trainable_tokens(nodes: Sequence[BatchNode], layout: NodeLayout, *, train_summaries: bool) -> np.ndarray:
    """[total] bool: tokens of trainable roles (:func:`~sapwood.platform.tree.trainable_roles`)."""
    roles = [int(r) for r in trainable_roles(train_summaries=train_summaries)]
    role_node = np.fromiter((r.role for r in nodes), dtype=np.int64, count=len(nodes))
    return np.isin(role_node, roles)[layout.node_of_token]


def rollout_logprobs(nodes: Sequence[BatchNode], layout: NodeLayout, spans: Mapping[bytes, bytes],
                     logprob_digests: Mapping[str, bytes], trainable: np.ndarray) -> np.ndarray:
    """[total] float32 recorded rollout log-probs of model-output nodes' tokens, 0 where not trainable."""
    logprob = np.zeros(layout.total, dtype=np.float32)
    out_calls = {i: r.call_id for i, r in enumerate(nodes) if r.call_id is not None}
    if out_calls:
        lp = np.frombuffer(b"".join(spans[logprob_digests[c]] for c in out_calls.values()), dtype=LOGPROB_DTYPE)
        out_idx = np.concatenate([np.arange(layout.starts[i], layout.starts[i] + layout.lengths[i])
                                  for i in out_calls])
        logprob[out_idx] = lp
    logprob[~trainable] = 0.0
    return logprob


def leaf_rewards(layout: NodeLayout, leaf_reward: Mapping[str, float]) -> np.ndarray:
    """[total] float32: each selected leaf's reward at its last token, NaN elsewhere."""
    out = np.full(layout.total, np.nan, dtype=np.float32)
    for leaf, value in leaf_reward.items():
        if leaf in layout.index:
            out[layout.ends[layout.index[leaf]]] = value
    return out


def build_batch(store: Store, execution_ids: list[str], config: SourceConfig) -> tuple[TreeBatch, list[str]]:
    """Assemble the Jmax-bounded subtrees of ``execution_ids``; return the batch and the ids it holds."""
    with store.transaction() as conn:
        return _assemble(conn, execution_ids, config)


def _assemble(conn: Connection, execution_ids: list[str], config: SourceConfig) -> tuple[TreeBatch, list[str]]:
    rows = tree_reader(conn).batch_rows(conn, execution_ids)
    sel = select_nodes(rows, execution_ids, config)
    if not sel.nodes:
        return _empty_batch(), []
    chosen = sel.nodes
    lp_digest = rows.logprob_digests
    spans = load_spans(conn, {r.span_digest for r in chosen}
                       | {lp_digest[r.call_id] for r in chosen if r.call_id is not None})
    layout = node_layout(chosen)
    per_node = layout.node_of_token

    def column(values: list[int]) -> torch.Tensor:
        return torch.from_numpy(np.asarray(values, dtype=np.int64)[per_node])

    tokens = np.frombuffer(b"".join(spans[r.span_digest] for r in chosen), dtype=TOKEN_DTYPE)
    trainable = trainable_tokens(chosen, layout, train_summaries=config.train_summaries)
    depth = np.fromiter((r.depth for r in chosen), dtype=np.int64, count=len(chosen))
    batch = TreeBatch(
        tokens=torch.from_numpy(tokens.astype(np.int64)),
        parent=torch.from_numpy(token_parents(chosen, layout)),
        position=torch.from_numpy(depth[per_node] + layout.offset_in_node()),
        role=column([r.role for r in chosen]),
        trainable=torch.from_numpy(trainable),
        rollout_logprob=torch.from_numpy(rollout_logprobs(chosen, layout, spans, lp_digest, trainable)),
        policy_version=column([r.policy_version if r.policy_version is not None else -1 for r in chosen]),
        execution=column(sel.execution_of_node),
        segment_parent=torch.from_numpy(segment_parents(chosen, layout)),
        leaf_reward=torch.from_numpy(leaf_rewards(layout, sel.leaf_reward)),
        task_family=sel.task_families,
        execution_ids=sel.execution_ids,
    )
    return batch, sel.execution_ids


def _empty_batch() -> TreeBatch:
    z = torch.zeros(0, dtype=torch.int64)
    return TreeBatch(
        tokens=z,
        parent=z,
        position=z,
        role=z,
        trainable=torch.zeros(0, dtype=torch.bool),
        rollout_logprob=torch.zeros(0),
        policy_version=z,
        execution=z,
        segment_parent=z,
        leaf_reward=torch.zeros(0),
        task_family=[],
        execution_ids=[],
    )
