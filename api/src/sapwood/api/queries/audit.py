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
from sapwood.platform.spans import load_spans, path_cte
from sapwood.platform.tokens import TOKEN_DTYPE, digest_bytes, unpack_logprobs, unpack_tokens

_n = t.nodes.c
_c = t.calls.c
CALL_COLUMNS = (_c.call_id, _c.execution_id, _c.seq, _c.call_kind, _c.segment, _c.policy_version, _c.input_node,
                _c.input_len, _c.output_node, _c.n_output, _c.finish_reason, _c.created_at)


def call_out(row: Any) -> dict[str, Any]:
    m = row._mapping if hasattr(row, "_mapping") else row
    return {c.name: m[c.name] for c in CALL_COLUMNS}


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


def context_path(conn: Connection, node_id: str) -> list[tuple[dict[str, Any], bytes]]:
    """(node facts, packed tokens) from the context's root to ``node_id`` (one recursive query)."""
    cols = (_n.node_id, _n.parent_id, _n.role, _n.depth, _n.length, _n.call_id, _n.policy_version, _n.span_digest)
    path = path_cte(sa.select(*cols).where(_n.node_id == node_id), conn.dialect.name)
    q = (sa.select(path.c.node_id, path.c.role, path.c.depth, path.c.length, path.c.call_id, path.c.policy_version,
                   t.spans.c.encoding, t.spans.c.data)
         .select_from(path.join(t.spans, t.spans.c.digest == path.c.span_digest))
         .order_by(path.c.depth))
    out = []
    for r in conn.execute(q):
        facts = {"node_id": r[0], "role": t.ROLE_NAMES[int(r[1])], "depth": int(r[2]), "length": int(r[3]),
                 "call_id": r[4], "policy_version": r[5]}
        out.append((facts, decode_span(r[6], r[7])))
    if not out:
        raise UnknownParentError(f"node {node_id} does not exist")
    return out


def call_row(conn: Connection, call_id: str) -> dict[str, Any]:
    e = t.executions.c
    q = (sa.select(*CALL_COLUMNS, _c.input_digest, _c.logprobs_digest, _c.timings,
                   _c.sampling_params.label("call_sampling_params"), e.engine, e.run_id, e.task_id,
                   e.sampling_params.label("execution_sampling_params"))
         .select_from(t.calls.join(t.executions, t.executions.c.execution_id == _c.execution_id))
         .where(_c.call_id == call_id))
    row = conn.execute(q).mappings().first()
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
    """Everything about one model call: exact input (verified), output, log-probs, version, engine, timings."""
    row = call_row(conn, call_id)
    rebuilt = rebuild_input(conn, row)
    out_digest = conn.execute(sa.select(_n.span_digest).where(_n.node_id == row["output_node"])).scalar_one()
    spans = load_spans(conn, [bytes(out_digest), bytes(row["logprobs_digest"])])
    out_ids = unpack_tokens(spans[bytes(out_digest)])
    out_lps = unpack_logprobs(spans[bytes(row["logprobs_digest"])])
    decode = tokenizer.decode if (tokenizer is not None and text) else None
    in_list = rebuilt.token_ids.tolist() if (tokens or decode) else None
    out_list = out_ids.tolist()
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
            "verified": rebuilt.verified, "token_ids": in_list if tokens else None,
            "text": decode(in_list) if decode and in_list is not None else None, "path": rebuilt.path,
        },
        "output": {
            "node_id": row["output_node"], "length": int(out_ids.size), "token_ids": out_list if tokens else None,
            "logprobs": out_lps.tolist() if tokens else None, "text": decode(out_list) if decode else None,
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
