"""Audit: the exact input of a model call rebuilt from the tree and checked against its recorded digest,
and the reverse question — which calls saw a given node in their input.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy.engine import Connection

from sapwood.api.cursors import Cursors
from sapwood.api.tokenizer import Tokenizer, per_token_text
from sapwood.platform.span_encoding import decode_span
from sapwood.platform.storage import calls as call_reads
from sapwood.platform.storage.backends import tree_reader
from sapwood.platform.storage.calls import CALL_NAMES
from sapwood.platform.tokens import TOKEN_DTYPE, digest_bytes, unpack_logprobs, unpack_tokens
from sapwood.platform.tree import ROLE_NAMES


def call_out(row: Any) -> dict[str, Any]:
    m = row._mapping if hasattr(row, "_mapping") else row
    return {name: m[name] for name in CALL_NAMES}


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


def call_row(conn: Connection, call_id: str) -> dict[str, Any]:
    """The call's columns, its execution's engine/run/task/sampling params, output spans (one query)."""
    return call_reads.call_with_output(conn, call_id)


def call_with_input(conn: Connection, call_id: str) -> tuple[dict[str, Any], RebuiltInput]:
    """:func:`call_row` and the call's input rebuilt from the tree: one statement."""
    row, parts = tree_reader(conn).call_context(conn, call_id)
    data = b"".join(p.data for p in parts)
    path = [{"node_id": p.node_id, "role": ROLE_NAMES[p.role], "depth": p.depth, "length": p.length,
             "call_id": p.call_id, "policy_version": p.policy_version} for p in parts]
    return row, RebuiltInput(np.frombuffer(data, dtype=TOKEN_DTYPE), digest_bytes(data).hex(), row["input_digest"],
                             int(row["input_len"]), path)


def audit(conn: Connection, call_id: str, *, tokenizer: Tokenizer | None, tokens: bool = True,
          text: bool = True, tokenizer_of: Callable[[Connection, str], Tokenizer | None] | None = None
          ) -> dict[str, Any]:
    """Everything about one model call: exact input (verified), output, log-probs, version, engine, timings.

    One statement (the input's path with the call, its output spans and its execution's facts on the
    root's row). Token ids and log-probs are numpy arrays (int32 [L], float32 [n]):
    :func:`sapwood.api.routes.dump` writes them directly. ``tokenizer_of`` (connection, execution id):
    the tokenizer of the call's execution, used when ``tokenizer`` is None (``SAPWOOD_TOKENIZER=recorded``).
    """
    row, rebuilt = call_with_input(conn, call_id)
    if tokenizer is None and tokenizer_of is not None and text:
        tokenizer = tokenizer_of(conn, str(row["execution_id"]))
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
            "token_texts": per_token_text(decode, out_ids.tolist()) if decode and tokens else None,
        },
    }


def calls_seeing(conn: Connection, node_id: str, *, limit: int, cursor: str | None,
                 cursors: Cursors) -> dict[str, Any]:
    """Calls whose input path contains ``node_id``: input_node is the node or one of its descendants
    in the same context (recursive walk down ``parent_id``), in event order."""
    token_start, token_end = call_reads.node_tokens_range(conn, node_id)
    after = cursors.decode(cursor, f"nodecalls:{node_id}", (int,))[0] if cursor else None
    rows = call_reads.calls_seeing_page(conn, node_id, after_seq=after, limit=limit + 1)
    more = len(rows) > limit
    rows = rows[:limit]
    return {
        "node_id": node_id, "token_start": token_start, "token_end": token_end,
        "items": [call_out(r) for r in rows],
        "next_cursor": cursors.encode(f"nodecalls:{node_id}", rows[-1].seq) if more else None,
    }


def list_calls(conn: Connection, execution_id: str, *, limit: int, cursor: str | None,
               cursors: Cursors) -> dict[str, Any]:
    """Model calls of one execution in event order."""
    after = cursors.decode(cursor, f"calls:{execution_id}", (int,))[0] if cursor else None
    rows = call_reads.calls_page(conn, execution_id, after_seq=after, limit=limit + 1)
    more = len(rows) > limit
    rows = rows[:limit]
    return {"items": [call_out(r) for r in rows],
            "next_cursor": cursors.encode(f"calls:{execution_id}", rows[-1].seq) if more else None}
