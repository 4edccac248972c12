"""Model-call reads: one call with its execution's facts and output spans, and pages of calls.

Dialect-free (the same statements on SQLite and PostgreSQL). Callers own the transaction.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from sapwood.platform import schema as t
from sapwood.platform.errors import UnknownParentError

_n = t.nodes.c
_c = t.calls.c
_e = t.executions.c
CALL_COLUMNS = (_c.call_id, _c.execution_id, _c.seq, _c.call_kind, _c.segment, _c.policy_version, _c.input_node,
                _c.input_len, _c.output_node, _c.n_output, _c.finish_reason, _c.created_at)
#: Names of a call row's columns, in order.
CALL_NAMES = tuple(str(c.name) for c in CALL_COLUMNS)

_out_node = t.nodes.alias("out_node")
_out_span = t.spans.alias("out_span")
_lp_span = t.spans.alias("lp_span")
#: A call with its execution's facts, output tokens and rollout log-probs: one statement, built once.
CALL_WITH_OUTPUT = (
    sa.select(*CALL_COLUMNS, _c.input_digest, _c.timings, _c.sampling_params.label("call_sampling_params"),
              _e.engine, _e.run_id, _e.task_id, _e.sampling_params.label("execution_sampling_params"),
              _out_span.c.encoding.label("out_encoding"), _out_span.c.data.label("out_data"),
              _lp_span.c.encoding.label("lp_encoding"), _lp_span.c.data.label("lp_data"))
    .select_from(t.calls.join(t.executions, _e.execution_id == _c.execution_id)
                 .join(_out_node, _out_node.c.node_id == _c.output_node)
                 .join(_out_span, _out_span.c.digest == _out_node.c.span_digest)
                 .join(_lp_span, _lp_span.c.digest == _c.logprobs_digest))
    .where(_c.call_id == sa.bindparam("call_id"))
)


def call_with_output(conn: Connection, call_id: str) -> dict[str, Any]:
    """The call's columns (:data:`CALL_NAMES`), ``input_digest timings call_sampling_params``, its execution's
    ``engine run_id task_id execution_sampling_params`` and the stored output spans
    (``out_encoding out_data lp_encoding lp_data``): one query."""
    row = conn.execute(CALL_WITH_OUTPUT, {"call_id": call_id}).mappings().first()
    if row is None:
        raise UnknownParentError(f"model call {call_id} does not exist")
    return dict(row)


def calls_page(conn: Connection, execution_id: str, *, after_seq: int | None, limit: int) -> list[Any]:
    """Up to ``limit`` calls of the execution in event order after ``after_seq``."""
    q = sa.select(*CALL_COLUMNS).where(_c.execution_id == execution_id)
    if after_seq is not None:
        q = q.where(_c.seq > after_seq)
    return list(conn.execute(q.order_by(_c.seq).limit(limit)).all())


def node_tokens_range(conn: Connection, node_id: str) -> tuple[int, int]:
    """``(depth, depth + length)``: the node's tokens in its context."""
    node = conn.execute(sa.select(_n.depth, _n.length).where(_n.node_id == node_id)).first()
    if node is None:
        raise UnknownParentError(f"node {node_id} does not exist")
    return int(node.depth), int(node.depth + node.length)


def calls_seeing_page(conn: Connection, node_id: str, *, after_seq: int | None, limit: int) -> list[Any]:
    """Up to ``limit`` calls (event order, after ``after_seq``) whose input contains ``node_id``: their input
    node is the node or one of its descendants in the same context (a recursive walk down ``parent_id``)."""
    base = sa.select(_n.node_id).where(_n.node_id == node_id).cte("below", recursive=True)
    down = t.nodes.alias("down")
    below = base.union_all(sa.select(down.c.node_id).where(down.c.parent_id == base.c.node_id))
    q = sa.select(*CALL_COLUMNS).where(_c.input_node.in_(sa.select(below.c.node_id)))
    if after_seq is not None:
        q = q.where(_c.seq > after_seq)
    return list(conn.execute(q.order_by(_c.seq).limit(limit)).all())


def output_digests(conn: Connection, call_id: str) -> tuple[bytes, bytes]:
    """``(output tokens' span digest, rollout log-probs' span digest)`` of model call ``call_id``."""
    row = conn.execute(sa.select(_n.span_digest, _c.logprobs_digest)
                       .select_from(t.calls.join(t.nodes, _n.node_id == _c.output_node))
                       .where(_c.call_id == call_id)).first()
    if row is None:
        raise UnknownParentError(f"model call {call_id} does not exist")
    return bytes(row[0]), bytes(row[1])
