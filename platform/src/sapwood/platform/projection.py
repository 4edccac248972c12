"""Projections: a canonical hash of everything derived from events, and rebuilds from events."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from sqlalchemy.engine import Connection

from sapwood.platform.apply import apply_events
from sapwood.platform.events import EVENT_TYPES, Event, build_event
from sapwood.platform.storage.event_log import clear_projections, event_row_chunks
from sapwood.platform.storage.event_log import projection_hash as projection_hash  # re-exported
from sapwood.platform.storage.spans import load_spans
from sapwood.platform.tokens import LOGPROB_DTYPE, TOKEN_DTYPE


def event_from_row(row: Any, spans: dict[bytes, bytes]) -> Event:
    """Rebuild an :class:`Event` from an ``events`` row and the span bytes it references."""
    body = dict(row.body)
    refs = body.pop("arrays", {})
    cls = EVENT_TYPES[row.kind]
    kinds = dict(cls.arrays)
    arrays: dict[str, np.ndarray] = {}
    for name, (digest_hex, count) in refs.items():
        dtype = TOKEN_DTYPE if kinds[name] == "tokens" else LOGPROB_DTYPE
        if count == 0 or digest_hex is None:
            arrays[name] = np.zeros(0, dtype=dtype)
        else:
            arrays[name] = np.frombuffer(spans[bytes.fromhex(digest_hex)], dtype=dtype)
    envelope = {"event_id": row.event_id, "execution_id": row.execution_id, "seq": row.seq,
                "schema_version": row.schema_version, "created_at": row.created_at}
    return build_event(row.kind, envelope, body, arrays)


def iter_stored_events(conn: Connection, *, chunk: int = 2000, where: Any = None) -> Any:
    """Yield lists of stored events in append order, ``chunk`` at a time (``where``: a filter on ``events``)."""
    for rows in event_row_chunks(conn, chunk=chunk, where=where):
        digests = {
            bytes.fromhex(ref[0])
            for r in rows
            for ref in r.body.get("arrays", {}).values()
            if ref[0] is not None
        }
        spans = load_spans(conn, digests)
        yield [event_from_row(r, spans) for r in rows]


def rebuild_projections(conn: Connection, progress: Callable[[int], None] | None = None) -> int:
    """Drop every projection row and re-derive them from the stored events; return events replayed."""
    clear_projections(conn)
    n = 0
    for batch in iter_stored_events(conn):
        apply_events(conn, batch, replay=True)
        n += len(batch)
        if progress:
            progress(len(batch))
    return n
