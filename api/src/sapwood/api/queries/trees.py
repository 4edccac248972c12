"""Trajectory trees: the whole tree (with limits), a collapsed summary, trajectories and token pages.

A node's *context* is its path to a root over ``parent_id``; a *logical trajectory* crosses
compactions: a segment root continues the summary node named by its ``prev_segment_node``,
so the path from a leaf upwards follows :func:`sapwood.platform.tree.logical_parent`. Every read
goes through the tree reader (:mod:`sapwood.platform.storage.trees`) and the execution reads
(:mod:`sapwood.platform.storage.executions`); this module shapes their records into API answers.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
from sqlalchemy.engine import Connection

from sapwood.api.cache import LRU
from sapwood.platform.storage import executions as execution_reads
from sapwood.platform.storage.backends import tree_reader
from sapwood.platform.storage.trees import PageSlice, PathNode, TreeNode
from sapwood.platform.tree import ROLE_NAMES, TRAINABLE_ROLES, resolve_reward

ROLE = ROLE_NAMES
TRAINABLE = tuple(TRAINABLE_ROLES)
#: A node of a logical path (root first) with its offset: the tree reader's record.
PathRow = PathNode


def node_out(n: TreeNode) -> dict[str, Any]:
    """A tree node as the API shows it."""
    return {
        "node_id": n.node_id, "parent_id": n.parent_id, "prev_segment_node": n.prev_segment_node,
        "role": ROLE[n.role], "length": n.length, "depth": n.depth, "level": n.level,
        "segment": n.segment, "is_leaf": n.is_leaf, "fork_branches": n.fork_branches,
        "n_children": n.n_children, "call_id": n.call_id, "policy_version": n.policy_version,
        "seq": n.seq,
    }


# -- executions ----------------------------------------------------------------------------------------
def execution_row(conn: Connection, execution_id: str) -> dict[str, Any]:
    return execution_reads.execution_row(conn, execution_id)


def execution_version(conn: Connection, execution_id: str) -> int:
    """``last_seq`` of the execution: every change to it is an event that bumps it (cache key)."""
    return execution_reads.execution_version(conn, execution_id)


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
    return tree_reader(conn).segment_roots(conn, execution_id, nodes)


def scores_of(conn: Connection, execution_id: str) -> list[dict[str, Any]]:
    return execution_reads.scores(conn, execution_id)


# -- trees ---------------------------------------------------------------------------------------------
def load_nodes(conn: Connection, execution_id: str) -> list[TreeNode]:
    """Every node of the execution in creation order (parents first), with levels and child counts."""
    return tree_reader(conn).nodes(conn, execution_id)


def full_tree(conn: Connection, ex: dict[str, Any], *, max_nodes: int, max_level: int | None) -> dict[str, Any]:
    """Nodes of the tree in creation order, at most ``max_nodes`` and down to ``max_level``."""
    eid = ex["execution_id"]
    total = int(ex["n_nodes"])
    if total <= max_nodes:
        nodes = load_nodes(conn, eid)
        kept = [n for n in nodes if max_level is None or n.level <= max_level]
        truncated = len(kept) < len(nodes)
    else:
        kept, truncated = tree_reader(conn).node_prefix(conn, eid, max_nodes, max_level), True
    segments = segments_of(conn, eid, kept if not truncated else None)
    fork_points = [n.node_id for n in kept if n.fork_branches > 0 or n.n_children > 1]
    return {
        "execution": execution_out(ex),
        "nodes": [node_out(n) for n in kept],
        "segments": segments,
        "scores": scores_of(conn, eid),
        "fork_points": fork_points,
        "leaves": [n.node_id for n in kept if n.is_leaf],
        "n_nodes_total": total,
        "truncated": truncated,
        "limits": {"max_nodes": max_nodes, "max_level": max_level},
    }


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
        "nodes": [{**node_out(n), "kinds": kept[n.node_id]} for n in nodes if n.node_id in kept],
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
#: Immutable paths by end node (nodes never change once written, so neither does a path to the root).
PathCache = LRU[str, list[PathRow]]


def logical_path(conn: Connection, node_id: str, cache: PathCache | None = None) -> list[PathRow]:
    """Nodes from the first root to ``node_id`` across compactions (one recursive query, or the cache)."""
    if cache is not None:
        hit = cache.get(node_id)
        if hit is not None:
            return hit
    out = tree_reader(conn).logical_path(conn, node_id)
    if cache is not None:
        cache.put(node_id, out)
    return out


def trajectory(conn: Connection, node_id: str, *, offset: int, limit: int,
               paths: PathCache | None = None) -> dict[str, Any]:
    """The logical trajectory ending at ``node_id`` and its tokens/log-probs in ``[offset, offset+limit)``.

    A piece's ``token_ids`` (int32 [n]) and ``logprobs`` (float32 [n] or None) stay numpy arrays for
    :func:`sapwood.api.routes.dump` (orjson writes them directly; ``tolist()`` cost more than the reads).
    """
    path = logical_path(conn, node_id, paths)
    leaf = path[-1]
    reader = tree_reader(conn)
    ex = reader.leaf_facts(conn, node_id)
    n_tokens = path[-1].offset + path[-1].length
    end = min(offset + limit, n_tokens)
    window = [p for p in path if p.offset < end and p.offset + p.length > offset]
    slices = [PageSlice(p.span_digest, p.call_id if p.call_id and p.role in TRAINABLE else None,
                        max(offset, p.offset) - p.offset, min(end, p.offset + p.length) - p.offset) for p in window]
    pieces = []
    for p, s, page in zip(window, slices, reader.token_pages(conn, slices), strict=True):
        pieces.append({"node_id": p.node_id, "role": ROLE[p.role], "segment": p.segment, "offset": p.offset + s.start,
                       "token_ids": page.token_ids, "logprobs": page.logprobs, "call_id": p.call_id,
                       "policy_version": p.policy_version})
    segments: list[dict[str, Any]] = []
    for p in path:
        if p.parent_id is None:
            segments.append({"segment": p.segment, "root_node": p.node_id, "from_node": p.prev_segment_node,
                             "offset": p.offset, "n_tokens": 0})
        segments[-1]["n_tokens"] += p.length
    rewards: dict[str, Any] = {"reward": None, "final_reward": None, "latest_score": None, "reward_source": None}
    if ex is not None:
        rewards = reward_fields(ex, leaf.node_id)
    return {
        "execution_id": leaf.execution_id, "leaf_node_id": leaf.node_id,
        "is_leaf": bool(ex["is_leaf"]) if ex is not None else True,
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
    reader = tree_reader(conn)
    node, digest = reader.node(conn, node_id)
    end = min(offset + limit, node.length)
    call_id = node.call_id if node.call_id and node.role in TRAINABLE else None
    (page,) = reader.token_pages(conn, [PageSlice(digest, call_id, offset, end)])
    out = {**node_out(node), "execution_id": node.execution_id, "offset": offset, "limit": limit,
           "next_offset": end if end < node.length else None, "token_ids": page.token_ids.tolist(),
           "logprobs": None if page.logprobs is None else page.logprobs.tolist(), "text": None}
    return out, page.token_ids
