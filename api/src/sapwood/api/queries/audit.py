"""Audit: the exact input of a model call rebuilt from the tree and checked against its recorded digest,
and the reverse question — which calls saw a given node in their input.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from sapwood.api.queries.cursors import Cursors
from sapwood.api.tokenizer import Tokenizer
from sapwood.platform import schema as t
from sapwood.platform.errors import UnknownParentError
from sapwood.platform.span_encoding import decode_span
from sapwood.platform.spans import path_cte
from sapwood.platform.tokens import TOKEN_DTYPE, digest_bytes, unpack_logprobs, unpack_tokens
from sapwood.platform.tree import ROLE_NAMES

_n = t.nodes.c
_c = t.calls.c
CALL_COLUMNS = (_c.call_id, _c.execution_id, _c.seq, _c.call_kind, _c.segment, _c.policy_version, _c.input_node,
                _c.input_len, _c.output_node, _c.n_output, _c.finish_reason, _c.created_at)


_CALL_NAMES = tuple(str(c.name) for c in CALL_COLUMNS)


def call_out(row: Any) -> dict[str, Any]:
    m = row._mapping if hasattr(row, "_mapping") else row
    return {name: m[name] for name in _CALL_NAMES}


@dataclass
class RebuiltInput:
    """A call's input rebuilt from the tree."""

    token_ids: np.ndarray
    computed_digest: str
    recorded_digest: str
    recorded_len: int
    path: list[dict[str, Any]]

    @property
    def verified(self) -> bool:
        return self.token_ids.size == self.recorded_len and self.computed_digest == self.recorded_digest


_e = t.executions.c
_out_node = t.nodes.alias("out_node")
_out_span = t.spans.alias("out_span")
_lp_span = t.spans.alias("lp_span")
#: A call with its execution's facts, output tokens and rollout log-probs: one statement, built once.
_CALL = (
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
_PATH_COLS = (_n.node_id, _n.parent_id, _n.depth, _n.span_digest, _n.role, _n.length, _n.call_id, _n.policy_version)


def _context_path_statement(dialect: str) -> sa.Select[Any]:
    path = path_cte(sa.select(*_PATH_COLS).where(_n.node_id == sa.bindparam("node_id")), dialect)
    return (sa.select(path.c.node_id, path.c.role, path.c.depth, path.c.length, path.c.call_id,
                      path.c.policy_version, t.spans.c.encoding, t.spans.c.data)
            .select_from(path.join(t.spans, t.spans.c.digest == path.c.span_digest))
            .order_by(path.c.depth))


#: Root → node facts and spans of a context (one recursive statement per dialect, built once).
_CONTEXT_PATH = {d: _context_path_statement(d) for d in ("postgresql", "sqlite")}


def context_path(conn: Connection, node_id: str) -> list[tuple[dict[str, Any], bytes]]:
    """(node facts, packed tokens) from the context's root to ``node_id`` (one recursive query)."""
    out = []
    for r in conn.execute(_CONTEXT_PATH[conn.dialect.name], {"node_id": node_id}):
        facts = {"node_id": r[0], "role": ROLE_NAMES[int(r[1])], "depth": int(r[2]), "length": int(r[3]),
                 "call_id": r[4], "policy_version": r[5]}
        out.append((facts, decode_span(r[6], r[7])))
    if not out:
        raise UnknownParentError(f"node {node_id} does not exist")
    return out


def call_row(conn: Connection, call_id: str) -> dict[str, Any]:
    """The call's columns, its execution's engine/run/task/sampling params, output spans (one query)."""
    row = conn.execute(_CALL, {"call_id": call_id}).mappings().first()
    if row is None:
        raise UnknownParentError(f"model call {call_id} does not exist")
    return dict(row)


def rebuild_input(conn: Connection, row: dict[str, Any]) -> RebuiltInput:
    parts = context_path(conn, row["input_node"])
    data = b"".join(p[1] for p in parts)
    return RebuiltInput(np.frombuffer(data, dtype=TOKEN_DTYPE), digest_bytes(data).hex(), row["input_digest"],
                        int(row["input_len"]), [p[0] for p in parts])


def audit(conn: Connection, call_id: str, *, tokenizer: Tokenizer | None, tokens: bool = True,
          text: bool = True) -> dict[str, Any]:
    """Everything about one model call: exact input (verified), output, log-probs, version, engine, timings.

    Two statements (the call with its output spans; the input's path). Token ids and log-probs are
    numpy arrays (int32 [L], float32 [n]): :func:`sapwood.api.routes.dump_json` writes them directly.
    """
    row = call_row(conn, call_id)
    rebuilt = rebuild_input(conn, row)
    out_ids = unpack_tokens(decode_span(row["out_encoding"], row["out_data"]))
    out_lps = unpack_logprobs(decode_span(row["lp_encoding"], row["lp_data"]))
    decode = tokenizer.decode if (tokenizer is not None and text) else None
    return {
        "call": call_out(row),
        "run_id": row["run_id"],
        "task_id": row["task_id"],
        "engine": row["engine"],
        "sampling_params": row["call_sampling_params"] or row["execution_sampling_params"] or {},
        "timings": row["timings"] or {},
        "verified": rebuilt.verified,
        "input": {
            "node_id": row["input_node"], "length": int(rebuilt.token_ids.size),
            "recorded_digest": rebuilt.recorded_digest, "computed_digest": rebuilt.computed_digest,
            "verified": rebuilt.verified, "token_ids": rebuilt.token_ids if tokens else None,
            "text": decode(rebuilt.token_ids.tolist()) if decode else None, "path": rebuilt.path,
        },
        "output": {
            "node_id": row["output_node"], "length": int(out_ids.size), "token_ids": out_ids if tokens else None,
            "logprobs": out_lps if tokens else None, "text": decode(out_ids.tolist()) if decode else None,
        },
    }


def calls_seeing(conn: Connection, node_id: str, *, limit: int, cursor: str | None,
                 cursors: Cursors) -> dict[str, Any]:
    """Calls whose input path contains ``node_id``: input_node is the node or one of its descendants
    in the same context (recursive walk down ``parent_id``), in event order."""
    node = conn.execute(sa.select(_n.depth, _n.length).where(_n.node_id == node_id)).first()
    if node is None:
        raise UnknownParentError(f"node {node_id} does not exist")
    base = sa.select(_n.node_id).where(_n.node_id == node_id).cte("below", recursive=True)
    down = t.nodes.alias("down")
    below = base.union_all(sa.select(down.c.node_id).where(down.c.parent_id == base.c.node_id))
    q = sa.select(*CALL_COLUMNS).where(_c.input_node.in_(sa.select(below.c.node_id)))
    if cursor:
        (after,) = cursors.decode(cursor, f"nodecalls:{node_id}", (int,))
        q = q.where(_c.seq > after)
    rows = conn.execute(q.order_by(_c.seq).limit(limit + 1)).all()
    more = len(rows) > limit
    rows = rows[:limit]
    return {
        "node_id": node_id, "token_start": int(node.depth), "token_end": int(node.depth + node.length),
        "items": [call_out(r) for r in rows],
        "next_cursor": cursors.encode(f"nodecalls:{node_id}", rows[-1].seq) if more else None,
    }


def list_calls(conn: Connection, execution_id: str, *, limit: int, cursor: str | None,
               cursors: Cursors) -> dict[str, Any]:
    """Model calls of one execution in event order."""
    q = sa.select(*CALL_COLUMNS).where(_c.execution_id == execution_id)
    if cursor:
        (after,) = cursors.decode(cursor, f"calls:{execution_id}", (int,))
        q = q.where(_c.seq > after)
    rows = conn.execute(q.order_by(_c.seq).limit(limit + 1)).all()
    more = len(rows) > limit
    rows = rows[:limit]
    return {"items": [call_out(r) for r in rows],
            "next_cursor": cursors.encode(f"calls:{execution_id}", rows[-1].seq) if more else None}
