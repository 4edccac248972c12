"""The tree reader's SQL, shared by both dialects: they differ only in one step of the recursive path walk.

:func:`path_cte` builds the walk from a node towards its root; a dialect passes the :data:`Step` that
joins each path row to the next node (:mod:`.sqlite.trees`: a plain join; :mod:`.postgres.trees`: a
``LATERAL ... LIMIT 1`` probe). :class:`SqlTreeReader` builds its statements once per dialect.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from sapwood.platform import schema as t
from sapwood.platform.errors import UnknownParentError
from sapwood.platform.span_encoding import decode_span
from sapwood.platform.storage.calls import CALL_WITH_OUTPUT
from sapwood.platform.storage.spans_sql import load_spans
from sapwood.platform.storage.trees import (
    BatchNode,
    BatchRows,
    ContextNode,
    PageSlice,
    PathNode,
    TokenPage,
    TreeNode,
)
from sapwood.platform.tokens import LOGPROB_DTYPE, TOKEN_DTYPE, TokenArray, unpack_logprobs, unpack_tokens
from sapwood.platform.tree import logical_parent_sql

Step = Callable[[sa.CTE, Sequence[str], sa.ColumnElement[Any]], tuple[sa.FromClause, Any]]
"""``step(path, names, next_id)`` → (path joined to the next node, that node's selectable with ``names``)."""


def path_cte(start: sa.Select[Any], step: Step, *, link: Callable[[sa.CTE], sa.ColumnElement[Any]] | None = None,
             counter: str | None = None, name: str = "path") -> sa.CTE:
    """Recursive CTE of the nodes from ``start``'s node up towards the root, one row per node.

    ``start`` selects columns of ``nodes`` (labelled with their column names) for one node; the CTE
    has the same columns. ``link(cte)`` gives the next node's id (default: ``parent_id``, the
    context's path; :func:`across_segments` crosses compactions). ``counter`` names a column of
    ``start`` that each step adds one to instead of reading it from ``nodes``.
    """
    base = start.cte(name, recursive=True)
    nxt = link(base) if link is not None else base.c.parent_id
    names = [c.name for c in base.c if c.name != counter]
    joined, src = step(base, names, nxt)
    cols = [(base.c[c.name] + 1).label(c.name) if c.name == counter else src.c[c.name] for c in base.c]
    return base.union_all(sa.select(*cols).select_from(joined))


def across_segments(path: sa.CTE) -> sa.ColumnElement[Any]:
    """The node before each path node across compactions: its parent, or for a segment root the summary."""
    return logical_parent_sql(path.c.parent_id, path.c.prev_segment_node)


_n = t.nodes.c
_c = t.calls.c
_e = t.executions.c
_TREE_COLUMNS = (_n.node_id, _n.parent_id, _n.prev_segment_node, _n.role, _n.length, _n.depth, _n.segment,
                 _n.is_leaf, _n.fork_branches, _n.call_id, _n.policy_version, _n.seq)
_PATH_COLUMNS = (_n.node_id, _n.parent_id, _n.prev_segment_node, _n.role, _n.span_digest, _n.length, _n.depth,
                 _n.segment, _n.call_id, _n.policy_version, _n.execution_id)
_BATCH_COLUMNS = (_n.node_id, _n.execution_id, _n.parent_id, _n.prev_segment_node, _n.role, _n.span_digest,
                  _n.length, _n.depth, _n.segment, _n.is_leaf, _n.call_id, _n.policy_version)
_SPAN_START = sa.select(_n.node_id, _n.parent_id, _n.depth, _n.span_digest)
_CONTEXT_START = sa.select(_n.node_id, _n.parent_id, _n.depth, _n.span_digest, _n.role, _n.length, _n.call_id,
                           _n.policy_version)
_logical_up = logical_parent_sql(_n.parent_id, _n.prev_segment_node)


def _tree_node(r: Any, execution_id: str) -> TreeNode:
    return TreeNode(r[0], execution_id, r[1], r[2], int(r[3]), int(r[5]), int(r[4]), int(r[6]), bool(r[7]),
                    int(r[8]), r[9], r[10], int(r[11]))


def _spans_in_order(path: sa.CTE, *columns: sa.ColumnElement[Any]) -> sa.Select[Any]:
    """``columns`` then the span (encoding, data) of each path row, root first."""
    return (sa.select(*columns, t.spans.c.encoding, t.spans.c.data)
            .select_from(path.join(t.spans, t.spans.c.digest == path.c.span_digest))
            .order_by(path.c.depth))


def _concat(rows: Sequence[Any], first: int) -> TokenArray:
    """Token ids [L] of path rows whose (encoding, data) start at column ``first``."""
    if len(rows) == 1:
        return np.frombuffer(decode_span(rows[0][first], rows[0][first + 1]), dtype=TOKEN_DTYPE)
    return np.frombuffer(b"".join(decode_span(r[first], r[first + 1]) for r in rows), dtype=TOKEN_DTYPE)


#: Rollout log-probs (encoding, data) of the calls named by the expanding ``call_ids``: one statement.
_LOGPROBS_SQL = (sa.select(_c.call_id, t.spans.c.encoding, t.spans.c.data)
                 .select_from(t.calls.join(t.spans, t.spans.c.digest == _c.logprobs_digest))
                 .where(_c.call_id.in_(sa.bindparam("call_ids", expanding=True))))
_LEAF_FACTS_SQL = (sa.select(_e.status, _e.reward, _e.score, _e.leaf_rewards, _n.is_leaf)
                   .select_from(t.nodes.join(t.executions, _e.execution_id == _n.execution_id))
                   .where(_n.node_id == sa.bindparam("node_id")))


def _with_levels(nodes: list[TreeNode]) -> list[TreeNode]:
    """Fill ``level`` and ``n_children`` of a whole tree listed parents first."""
    index = {n.node_id: n for n in nodes}
    for n in nodes:
        up = index.get(n.up) if n.up else None
        if up is not None:
            n.level = up.level + 1
            up.n_children += 1
    return nodes


class SqlTreeReader:
    """:class:`~sapwood.platform.storage.trees.TreeReader` over the schema's tables; a dialect gives ``step``."""

    step: Step

    def __init__(self) -> None:
        node = _n.node_id == sa.bindparam("node_id")
        self.context_tokens_sql = _spans_in_order(path_cte(_SPAN_START.where(node), self.step))
        call_path = path_cte(_SPAN_START.join(t.calls, _c.input_node == _n.node_id)
                             .where(_c.call_id == sa.bindparam("call_id")), self.step)
        recorded = sa.select(_c.input_len).where(_c.call_id == sa.bindparam("call_id")).scalar_subquery()
        self.call_input_sql = _spans_in_order(call_path, recorded)
        ctx = path_cte(_CONTEXT_START.where(node), self.step)
        self.context_sql = _spans_in_order(ctx, ctx.c.node_id, ctx.c.role, ctx.c.depth, ctx.c.length, ctx.c.call_id,
                                        ctx.c.policy_version)
        # the call's facts ride on the context's root row (every other row has NULLs there): one round trip
        call_ctx = path_cte(_CONTEXT_START.join(t.calls, _c.input_node == _n.node_id)
                            .where(_c.call_id == sa.bindparam("call_id")), self.step)
        facts = CALL_WITH_OUTPUT.subquery("facts")
        self.call_context_sql = (
            sa.select(call_ctx.c.node_id, call_ctx.c.role, call_ctx.c.depth, call_ctx.c.length, call_ctx.c.call_id,
                      call_ctx.c.policy_version, t.spans.c.encoding, t.spans.c.data,
                      *(c.label(f"call_{c.name}") for c in facts.c))
            .select_from(call_ctx.join(t.spans, t.spans.c.digest == call_ctx.c.span_digest)
                         .outerjoin(facts, call_ctx.c.parent_id.is_(None)))
            .order_by(call_ctx.c.depth))
        self.call_fact_names = tuple(str(c.name) for c in facts.c)
        # built once: building the recursive CTE per call cost ~3 ms of Python, 10x the query itself
        lpath = path_cte(sa.select(*_PATH_COLUMNS, sa.literal(0).label("k")).where(node), self.step,
                         link=across_segments, counter="k", name="lpath")
        self.logical_path_sql = sa.select(*(lpath.c[c.name] for c in _PATH_COLUMNS)).order_by(lpath.c.k.desc())

    # -- whole trees ---------------------------------------------------------------------------------
    @staticmethod
    def _nodes_query(execution_id: str) -> sa.Select[Any]:
        return sa.select(*_TREE_COLUMNS).where(_n.execution_id == execution_id).order_by(_n.seq, _n.depth, _n.node_id)

    def nodes(self, conn: Connection, execution_id: str) -> list[TreeNode]:
        return _with_levels([_tree_node(r, execution_id) for r in conn.execute(self._nodes_query(execution_id))])

    def node_prefix(self, conn: Connection, execution_id: str, max_nodes: int,
                    max_level: int | None) -> list[TreeNode]:
        kept: list[TreeNode] = []
        levels: dict[str, int] = {}
        result = conn.execution_options(stream_results=True, yield_per=2000).execute(self._nodes_query(execution_id))
        try:
            for r in result:
                n = _tree_node(r, execution_id)
                n.level = levels[n.up] + 1 if n.up in levels else 0
                levels[n.node_id] = n.level
                if max_level is None or n.level <= max_level:
                    kept.append(n)
                    if len(kept) >= max_nodes:
                        break
        finally:
            result.close()
        by_id = {n.node_id: n for n in kept}  # child counts over the whole tree, not only the kept prefix
        for node_id, count in conn.execute(sa.select(_logical_up, sa.func.count())
                                           .where(_n.execution_id == execution_id, _logical_up.is_not(None))
                                           .group_by(_logical_up)):
            if node_id in by_id:
                by_id[node_id].n_children = int(count)
        return kept

    def node(self, conn: Connection, node_id: str) -> tuple[TreeNode, bytes]:
        row = conn.execute(sa.select(*_TREE_COLUMNS, _n.execution_id, _n.span_digest).where(_n.node_id == node_id)
                           ).first()
        if row is None:
            raise UnknownParentError(f"node {node_id} does not exist")
        node = _tree_node(row, row.execution_id)
        node.n_children = int(conn.execute(sa.select(sa.func.count()).where(_logical_up == node_id)).scalar_one())
        path = path_cte(sa.select(_n.node_id, _n.parent_id, _n.prev_segment_node).where(_n.node_id == node_id),
                        self.step, link=across_segments, name="lvl")
        node.level = int(conn.execute(sa.select(sa.func.count()).select_from(path)).scalar_one()) - 1
        return node, bytes(row.span_digest)

    def segment_roots(self, conn: Connection, execution_id: str,
                      nodes: Iterable[TreeNode] | None = None) -> list[dict[str, Any]]:
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

    # -- paths and contexts --------------------------------------------------------------------------
    def logical_path(self, conn: Connection, node_id: str) -> list[PathNode]:
        rows = conn.execute(self.logical_path_sql, {"node_id": node_id}).all()
        if not rows:
            raise UnknownParentError(f"node {node_id} does not exist")
        out = [PathNode(r[0], r[10], r[1], r[2], int(r[3]), int(r[6]), int(r[5]), int(r[7]), bytes(r[4]), r[8], r[9])
               for r in rows]
        offset = 0
        for p in out:
            p.offset = offset
            offset += p.length
        return out

    def context(self, conn: Connection, node_id: str) -> list[ContextNode]:
        out = [ContextNode(r[0], int(r[1]), int(r[2]), int(r[3]), r[4], r[5], decode_span(r[6], r[7]))
               for r in conn.execute(self.context_sql, {"node_id": node_id})]
        if not out:
            raise UnknownParentError(f"node {node_id} does not exist")
        return out

    def context_tokens(self, conn: Connection, node_id: str) -> TokenArray:
        rows = conn.execute(self.context_tokens_sql, {"node_id": node_id}).all()
        if not rows:
            raise UnknownParentError(f"node {node_id} does not exist")
        return _concat(rows, 0)

    def call_context(self, conn: Connection, call_id: str) -> tuple[dict[str, Any], list[ContextNode]]:
        rows = conn.execute(self.call_context_sql, {"call_id": call_id}).all()
        if not rows or rows[0][8] is None:  # no such call (or, impossibly, a context without its root)
            raise UnknownParentError(f"model call {call_id} does not exist")
        call = dict(zip(self.call_fact_names, rows[0][8:], strict=True))
        return call, [ContextNode(r[0], int(r[1]), int(r[2]), int(r[3]), r[4], r[5], decode_span(r[6], r[7]))
                      for r in rows]

    def call_input(self, conn: Connection, call_id: str) -> tuple[TokenArray, int]:
        rows = conn.execute(self.call_input_sql, {"call_id": call_id}).all()
        if not rows:
            raise UnknownParentError(f"model call {call_id} does not exist")
        return _concat(rows, 1), int(rows[0][0])

    # -- tokens --------------------------------------------------------------------------------------
    def token_pages(self, conn: Connection, slices: Sequence[PageSlice]) -> list[TokenPage]:
        """Two statements (the spans; the calls' log-probs joined to their spans), whatever the slices."""
        if not slices:
            return []
        data = load_spans(conn, [s.span_digest for s in slices])
        call_ids = list({s.call_id for s in slices if s.call_id})
        lps = {r[0]: decode_span(r[1], r[2]) for r in conn.execute(_LOGPROBS_SQL, {"call_ids": call_ids})} \
            if call_ids else {}
        return [TokenPage(unpack_tokens(data[s.span_digest])[s.start:s.stop],
                          unpack_logprobs(lps[s.call_id])[s.start:s.stop] if s.call_id in lps else None)
                for s in slices]

    def execution_spans(self, conn: Connection, execution_id: str
                        ) -> tuple[dict[str, TokenArray], dict[str, np.ndarray]]:
        digests = {r[0]: bytes(r[1]) for r in conn.execute(sa.select(_n.node_id, _n.span_digest)
                                                           .where(_n.execution_id == execution_id))}
        lp_digests = {r[0]: bytes(r[1]) for r in conn.execute(sa.select(_c.output_node, _c.logprobs_digest)
                                                              .where(_c.execution_id == execution_id))}
        spans = load_spans(conn, list(digests.values()) + list(lp_digests.values()))
        return ({nid: np.frombuffer(spans[d], dtype=TOKEN_DTYPE) for nid, d in digests.items()},
                {nid: np.frombuffer(spans[d], dtype=LOGPROB_DTYPE) for nid, d in lp_digests.items()})

    def leaf_facts(self, conn: Connection, node_id: str) -> Mapping[str, Any] | None:
        row = conn.execute(_LEAF_FACTS_SQL, {"node_id": node_id}).first()
        return None if row is None else dict(row._mapping)

    def batch_rows(self, conn: Connection, execution_ids: Sequence[str]) -> BatchRows:
        ids = list(execution_ids)
        out = BatchRows({r.execution_id: r for r in conn.execute(sa.select(t.executions)
                                                                  .where(_e.execution_id.in_(ids)))})
        for r in conn.execute(sa.select(*_BATCH_COLUMNS).where(_n.execution_id.in_(ids))):
            out.nodes.setdefault(r[1], []).append(
                BatchNode(r[0], r[1], r[2], r[3], int(r[4]), bytes(r[5]), int(r[6]), int(r[7]), int(r[8]), bool(r[9]),
                          r[10], r[11]))
        out.logprob_digests = {r[0]: bytes(r[1]) for r in conn.execute(
            sa.select(_c.call_id, _c.logprobs_digest).where(_c.execution_id.in_(ids)))}
        return out
