"""Trajectory trees: the whole tree (with limits), a collapsed summary, trajectories and token pages.

A node's *context* is its path to a root over ``parent_id``; a *logical trajectory* crosses
compactions: a segment root continues the summary node named by its ``prev_segment_node``,
so the path from a leaf upwards follows ``COALESCE(parent_id, prev_segment_node)``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from sapwood.api.cache import LRU
from sapwood.platform import schema as t
from sapwood.platform.errors import UnknownParentError
from sapwood.platform.spans import load_spans, path_cte
from sapwood.platform.tokens import unpack_logprobs, unpack_tokens
from sapwood.platform.tree import ROLE_NAMES, TRAINABLE_ROLES, logical_parent, logical_parent_sql, resolve_reward

ROLE = ROLE_NAMES
TRAINABLE = tuple(TRAINABLE_ROLES)

_n = t.nodes.c
NODE_COLUMNS = (_n.node_id, _n.parent_id, _n.prev_segment_node, _n.role, _n.length, _n.depth, _n.segment,
                _n.is_leaf, _n.fork_branches, _n.call_id, _n.policy_version, _n.seq)


@dataclass(slots=True)
class TreeNode:
    """One node row of an execution's tree, with derived tree facts."""

    node_id: str
    parent_id: str | None
    prev_segment_node: str | None
    role: int
    length: int
    depth: int
    segment: int
    is_leaf: bool
    fork_branches: int
    call_id: str | None
    policy_version: int | None
    seq: int
    level: int = 0
    n_children: int = 0

    def out(self) -> dict[str, Any]:
        return {
            "node_id": self.node_id, "parent_id": self.parent_id, "prev_segment_node": self.prev_segment_node,
            "role": ROLE[self.role], "length": self.length, "depth": self.depth, "level": self.level,
            "segment": self.segment, "is_leaf": self.is_leaf, "fork_branches": self.fork_branches,
            "n_children": self.n_children, "call_id": self.call_id, "policy_version": self.policy_version,
            "seq": self.seq,
        }

    @property
    def up(self) -> str | None:
        """Previous node of the logical trajectory (parent, or the summary a segment root continues)."""
        return logical_parent(self.parent_id, self.prev_segment_node)


# -- executions ----------------------------------------------------------------------------------------
def execution_row(conn: Connection, execution_id: str) -> dict[str, Any]:
    row = conn.execute(sa.select(t.executions).where(t.executions.c.execution_id == execution_id)).mappings().first()
    if row is None:
        raise UnknownParentError(f"execution {execution_id} does not exist")
    return dict(row)


def execution_version(conn: Connection, execution_id: str) -> int:
    """``last_seq`` of the execution: every change to it is an event that bumps it (cache key)."""
    seq = conn.execute(sa.select(t.executions.c.last_seq).where(t.executions.c.execution_id == execution_id)
                       ).scalar_one_or_none()
    if seq is None:
        raise UnknownParentError(f"execution {execution_id} does not exist")
    return int(seq)


def reward_fields(ex: Any, leaf_id: str | None = None) -> dict[str, Any]:
    """The reward the learner trains on (``sapwood.platform.tree``, default policy) and the raw values beside it.

    ``ex`` is an execution row (mapping) with ``status``, ``reward``, ``score`` and ``leaf_rewards``;
    with ``leaf_id`` the result is that trajectory's reward.
    """
    got = resolve_reward(ex["status"], ex["reward"], ex["score"], ex["leaf_rewards"], leaf_id)
    return {"reward": got.reward, "final_reward": ex["reward"], "latest_score": ex["score"],
            "reward_source": got.source}


def execution_out(row: Any) -> dict[str, Any]:
    out = dict(row)
    out["sampling_params"] = out.get("sampling_params") or {}
    out["metadata"] = out.get("metadata") or {}
    out["leaf_rewards"] = out.get("leaf_rewards") or {}
    out.update(reward_fields(out))
    return out


def segments_of(conn: Connection, execution_id: str, nodes: Iterable[TreeNode] | None = None) -> list[dict[str, Any]]:
    """Segment roots: the context roots of segment 0, then one row per compaction."""
    if nodes is None:
        q = sa.select(_n.node_id, _n.seq).where(_n.execution_id == execution_id, _n.parent_id.is_(None),
                                                _n.prev_segment_node.is_(None))
        first = [{"segment": 0, "root_node": r.node_id, "from_node": None, "seq": r.seq} for r in conn.execute(q)]
    else:
        first = [{"segment": 0, "root_node": n.node_id, "from_node": None, "seq": n.seq}
                 for n in nodes if n.parent_id is None and n.prev_segment_node is None]
    s = t.segments.c
    rest = conn.execute(sa.select(s.segment, s.root_node, s.from_node, s.seq).where(s.execution_id == execution_id))
    out = first + [dict(r._mapping) for r in rest]
    out.sort(key=lambda r: (r["seq"], r["segment"]))
    return out


def scores_of(conn: Connection, execution_id: str) -> list[dict[str, Any]]:
    s = t.scores.c
    rows = conn.execute(sa.select(s.event_id, s.revision, s.score, s.components, s.scorer, s.note, s.created_at)
                        .where(s.execution_id == execution_id).order_by(s.revision)).mappings()
    return [dict(r) for r in rows]


# -- trees ---------------------------------------------------------------------------------------------
def _node(r: Any) -> TreeNode:
    return TreeNode(r[0], r[1], r[2], int(r[3]), int(r[4]), int(r[5]), int(r[6]), bool(r[7]), int(r[8]), r[9], r[10],
                    int(r[11]))


def _nodes_query(execution_id: str) -> sa.Select[Any]:
    return sa.select(*NODE_COLUMNS).where(_n.execution_id == execution_id).order_by(_n.seq, _n.depth, _n.node_id)


def load_nodes(conn: Connection, execution_id: str) -> list[TreeNode]:
    """Every node of the execution in creation order (parents first), with levels and child counts."""
    nodes = [_node(r) for r in conn.execute(_nodes_query(execution_id))]
    index = {n.node_id: n for n in nodes}
    for n in nodes:
        up = index.get(n.up) if n.up else None
        if up is not None:
            n.level = up.level + 1
            up.n_children += 1
    return nodes


def full_tree(conn: Connection, ex: dict[str, Any], *, max_nodes: int, max_level: int | None) -> dict[str, Any]:
    """Nodes of the tree in creation order, at most ``max_nodes`` and down to ``max_level``."""
    eid = ex["execution_id"]
    total = int(ex["n_nodes"])
    if total <= max_nodes:
        nodes = load_nodes(conn, eid)
        kept = [n for n in nodes if max_level is None or n.level <= max_level]
        truncated = len(kept) < len(nodes)
    else:
        kept, truncated = _prefix(conn, eid, max_nodes, max_level), True
    segments = segments_of(conn, eid, kept if not truncated else None)
    fork_points = [n.node_id for n in kept if n.fork_branches > 0 or n.n_children > 1]
    return {
        "execution": execution_out(ex),
        "nodes": [n.out() for n in kept],
        "segments": segments,
        "scores": scores_of(conn, eid),
        "fork_points": fork_points,
        "leaves": [n.node_id for n in kept if n.is_leaf],
        "n_nodes_total": total,
        "truncated": truncated,
        "limits": {"max_nodes": max_nodes, "max_level": max_level},
    }


def _prefix(conn: Connection, eid: str, max_nodes: int, max_level: int | None) -> list[TreeNode]:
    """The first ``max_nodes`` nodes (creation order) within ``max_level``; reads no more rows than needed."""
    kept: list[TreeNode] = []
    levels: dict[str, int] = {}
    result = conn.execution_options(stream_results=True, yield_per=2000).execute(_nodes_query(eid))
    try:
        for r in result:
            n = _node(r)
            n.level = levels[n.up] + 1 if n.up in levels else 0
            levels[n.node_id] = n.level
            if max_level is None or n.level <= max_level:
                kept.append(n)
                if len(kept) >= max_nodes:
                    break
    finally:
        result.close()
    # child counts over the whole tree, not only the kept prefix
    up = logical_parent_sql(_n.parent_id, _n.prev_segment_node)
    by_id = {n.node_id: n for n in kept}
    for node_id, count in conn.execute(
        sa.select(up, sa.func.count()).where(_n.execution_id == eid, up.is_not(None)).group_by(up)
    ):
        if node_id in by_id:
            by_id[node_id].n_children = int(count)
    return kept


def tree_summary(conn: Connection, ex: dict[str, Any]) -> dict[str, Any]:
    """Kept nodes (roots, segment roots, forks, compacted summaries, leaves) and collapsed chains between them."""
    eid = ex["execution_id"]
    nodes = load_nodes(conn, eid)
    index = {n.node_id: n for n in nodes}
    children: dict[str, list[str]] = {}
    continued: dict[str, list[str]] = {}
    for n in nodes:
        if n.parent_id is not None:
            children.setdefault(n.parent_id, []).append(n.node_id)
        elif n.prev_segment_node is not None:
            continued.setdefault(n.prev_segment_node, []).append(n.node_id)

    def kinds(n: TreeNode) -> list[str]:
        k = []
        if n.parent_id is None:
            k.append("root" if n.prev_segment_node is None else "segment_root")
        if n.fork_branches > 0 or len(children.get(n.node_id, ())) > 1:
            k.append("fork")
        if n.node_id in continued:
            k.append("compacted")
        if n.is_leaf:
            k.append("leaf")
        return k

    kept = {n.node_id: kinds(n) for n in nodes}
    kept = {nid: k for nid, k in kept.items() if k or len(children.get(nid, ())) != 1}
    edges: list[dict[str, Any]] = []
    for n in nodes:
        if n.node_id not in kept:
            continue
        for child in children.get(n.node_id, ()):
            cur = child
            count = tokens = calls = 0
            by_role: dict[str, int] = {}
            while cur not in kept:
                c = index[cur]
                count += 1
                tokens += c.length
                calls += c.call_id is not None
                by_role[ROLE[c.role]] = by_role.get(ROLE[c.role], 0) + c.length
                cur = children[cur][0]
            edges.append({"parent": n.node_id, "child": cur, "kind": "chain", "n_nodes": count, "n_tokens": tokens,
                          "n_calls": calls, "tokens_by_role": by_role})
        for root in continued.get(n.node_id, ()):
            edges.append({"parent": n.node_id, "child": root, "kind": "segment", "n_nodes": 0, "n_tokens": 0,
                          "n_calls": 0, "tokens_by_role": {}})
    return {
        "execution": execution_out(ex),
        "nodes": [{**n.out(), "kinds": kept[n.node_id]} for n in nodes if n.node_id in kept],
        "edges": edges,
        "segments": segments_of(conn, eid, nodes),
        "scores": scores_of(conn, eid),
        "n_nodes_total": len(nodes),
    }


def trajectories(conn: Connection, ex: dict[str, Any]) -> list[dict[str, Any]]:
    """One entry per leaf: its logical length across segments, trainable tokens and reward."""
    nodes = load_nodes(conn, ex["execution_id"])
    total: dict[str, int] = {}
    trainable: dict[str, int] = {}
    n_segments: dict[str, int] = {}
    for n in nodes:
        up = n.up
        total[n.node_id] = total.get(up, 0) + n.length if up else n.length
        trainable[n.node_id] = (trainable.get(up, 0) if up else 0) + (n.length if n.role in TRAINABLE else 0)
        n_segments[n.node_id] = (n_segments.get(up, 1) if up else 1) + (1 if n.parent_id is None and up else 0)
    return [
        {"leaf_node_id": n.node_id, "segment": n.segment, "n_segments": n_segments[n.node_id],
         "n_tokens": total[n.node_id], "n_trainable": trainable[n.node_id], **reward_fields(ex, n.node_id)}
        for n in nodes if n.is_leaf
    ]


# -- paths and token pages -----------------------------------------------------------------------------
@dataclass(slots=True)
class PathRow:
    node_id: str
    parent_id: str | None
    prev_segment_node: str | None
    role: int
    span_digest: bytes
    length: int
    depth: int
    segment: int
    call_id: str | None
    policy_version: int | None
    execution_id: str
    offset: int = 0


#: Immutable paths by end node (nodes never change once written, so neither does a path to the root).
PathCache = LRU[str, list[PathRow]]


def _across_segments(path: sa.CTE) -> sa.ColumnElement[Any]:
    """The node before each path node across compactions: its parent, or for a segment root the summary."""
    return logical_parent_sql(path.c.parent_id, path.c.prev_segment_node)


def logical_path(conn: Connection, node_id: str, cache: PathCache | None = None) -> list[PathRow]:
    """Nodes from the first root to ``node_id`` across compactions (one recursive query, or the cache)."""
    if cache is not None:
        hit = cache.get(node_id)
        if hit is not None:
            return hit
    cols = (_n.node_id, _n.parent_id, _n.prev_segment_node, _n.role, _n.span_digest, _n.length, _n.depth, _n.segment,
            _n.call_id, _n.policy_version, _n.execution_id)
    path = path_cte(sa.select(*cols, sa.literal(0).label("k")).where(_n.node_id == node_id), conn.dialect.name,
                    link=_across_segments, counter="k", name="lpath")
    rows = conn.execute(sa.select(*(path.c[c.name] for c in cols)).order_by(path.c.k.desc())).all()
    if not rows:
        raise UnknownParentError(f"node {node_id} does not exist")
    out = [PathRow(r[0], r[1], r[2], int(r[3]), bytes(r[4]), int(r[5]), int(r[6]), int(r[7]), r[8], r[9], r[10])
           for r in rows]
    offset = 0
    for p in out:
        p.offset = offset
        offset += p.length
    if cache is not None:
        cache.put(node_id, out)
    return out


def _logprob_digests(conn: Connection, call_ids: Sequence[str]) -> dict[str, bytes]:
    if not call_ids:
        return {}
    c = t.calls.c
    rows = conn.execute(sa.select(c.call_id, c.logprobs_digest).where(c.call_id.in_(list(call_ids))))
    return {r[0]: bytes(r[1]) for r in rows}


def trajectory(conn: Connection, node_id: str, *, offset: int, limit: int,
               paths: PathCache | None = None) -> dict[str, Any]:
    """The logical trajectory ending at ``node_id`` and its tokens/log-probs in ``[offset, offset+limit)``."""
    path = logical_path(conn, node_id, paths)
    leaf = path[-1]
    e = t.executions.c
    ex = conn.execute(sa.select(e.status, e.reward, e.score, e.leaf_rewards, _n.is_leaf)
                      .select_from(t.nodes.join(t.executions, e.execution_id == _n.execution_id))
                      .where(_n.node_id == node_id)).first()
    n_tokens = path[-1].offset + path[-1].length
    end = min(offset + limit, n_tokens)
    window = [p for p in path if p.offset < end and p.offset + p.length > offset]
    data = load_spans(conn, [p.span_digest for p in window])
    lp_digests = _logprob_digests(conn, [p.call_id for p in window if p.call_id and p.role in TRAINABLE])
    lp_data = load_spans(conn, lp_digests.values()) if lp_digests else {}
    pieces = []
    for p in window:
        a, b = max(offset, p.offset) - p.offset, min(end, p.offset + p.length) - p.offset
        ids = unpack_tokens(data[p.span_digest])[a:b]
        lps = None
        if p.call_id in lp_digests:
            lps = unpack_logprobs(lp_data[lp_digests[p.call_id]])[a:b].tolist()
        pieces.append({"node_id": p.node_id, "role": ROLE[p.role], "segment": p.segment, "offset": p.offset + a,
                       "token_ids": ids.tolist(), "logprobs": lps, "call_id": p.call_id,
                       "policy_version": p.policy_version})
    segments: list[dict[str, Any]] = []
    for p in path:
        if p.parent_id is None:
            segments.append({"segment": p.segment, "root_node": p.node_id, "from_node": p.prev_segment_node,
                             "offset": p.offset, "n_tokens": 0})
        segments[-1]["n_tokens"] += p.length
    rewards: dict[str, Any] = {"reward": None, "final_reward": None, "latest_score": None, "reward_source": None}
    if ex is not None:
        rewards = reward_fields(ex._mapping, leaf.node_id)
    return {
        "execution_id": leaf.execution_id, "leaf_node_id": leaf.node_id, "is_leaf": bool(ex.is_leaf) if ex else True,
        **rewards,
        "n_tokens": n_tokens, "offset": offset, "limit": limit, "next_offset": end if end < n_tokens else None,
        "segments": segments,
        "nodes": [{"node_id": p.node_id, "role": ROLE[p.role], "segment": p.segment, "offset": p.offset,
                   "depth": p.depth, "length": p.length, "call_id": p.call_id, "policy_version": p.policy_version}
                  for p in path],
        "pieces": pieces,
    }


def node_detail(conn: Connection, node_id: str, *, offset: int, limit: int) -> tuple[dict[str, Any], np.ndarray]:
    """A node's row and its tokens/log-probs in ``[offset, offset+limit)``; also returns the token slice."""
    row = conn.execute(sa.select(*NODE_COLUMNS, _n.execution_id, _n.span_digest).where(_n.node_id == node_id)).first()
    if row is None:
        raise UnknownParentError(f"node {node_id} does not exist")
    node = _node(row)
    up = logical_parent_sql(_n.parent_id, _n.prev_segment_node)
    node.n_children = int(conn.execute(sa.select(sa.func.count()).where(up == node_id)).scalar_one())
    node.level = _level(conn, node_id)
    end = min(offset + limit, node.length)
    digest = bytes(row.span_digest)
    ids = unpack_tokens(load_spans(conn, [digest])[digest])[offset:end]
    lps = None
    if node.call_id and node.role in TRAINABLE:
        lpd = _logprob_digests(conn, [node.call_id]).get(node.call_id)
        if lpd is not None:
            lps = unpack_logprobs(load_spans(conn, [lpd])[lpd])[offset:end].tolist()
    out = {**node.out(), "execution_id": row.execution_id, "offset": offset, "limit": limit,
           "next_offset": end if end < node.length else None, "token_ids": ids.tolist(), "logprobs": lps,
           "text": None}
    return out, ids


def _level(conn: Connection, node_id: str) -> int:
    path = path_cte(sa.select(_n.node_id, _n.parent_id, _n.prev_segment_node).where(_n.node_id == node_id),
                    conn.dialect.name, link=_across_segments, name="lvl")
    return int(conn.execute(sa.select(sa.func.count()).select_from(path)).scalar_one()) - 1
