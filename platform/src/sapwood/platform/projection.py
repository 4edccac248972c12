"""Projections: a canonical hash of everything derived from events, and rebuilds from events."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from sapwood.platform import schema as t
from sapwood.platform.apply import apply_events
from sapwood.platform.events import EVENT_TYPES, Event, build_event
from sapwood.platform.spans import load_spans
from sapwood.platform.tokens import LOGPROB_DTYPE, TOKEN_DTYPE


def _canon(value: Any) -> str:
    if value is None:
        return "~"
    if isinstance(value, bool):
        return "T" if value else "F"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, bytes | memoryview):
        return bytes(value).hex()
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    return str(value)


def projection_hash(conn: Connection, tables: Sequence[sa.Table] = t.PROJECTION_TABLES) -> str:
    """SHA-256 over every projection row in primary-key order: equal hashes ⇔ equal projections.

    ``tables`` narrows it to some projections (e.g. those an older schema revision has)."""
    h = hashlib.sha256()
    for table in tables:
        h.update(f"#{table.name}\n".encode())
        order = list(table.primary_key.columns)
        for row in conn.execute(sa.select(table).order_by(*order)):
            h.update("\x1f".join(_canon(v) for v in row).encode())
            h.update(b"\n")
    return h.hexdigest()


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
    """Yield lists of stored events in append order, ``chunk`` at a time."""
    after = 0
    while True:
        q = sa.select(t.events).where(t.events.c.pos > after).order_by(t.events.c.pos).limit(chunk)
        if where is not None:
            q = q.where(where)
        rows = conn.execute(q).all()
        if not rows:
            return
        digests = {
            bytes.fromhex(ref[0])
            for r in rows
            for ref in r.body.get("arrays", {}).values()
            if ref[0] is not None
        }
        spans = load_spans(conn, digests)
        yield [event_from_row(r, spans) for r in rows]
        after = rows[-1].pos


def rebuild_projections(conn: Connection, progress: Callable[[int], None] | None = None) -> int:
    """Drop every projection row and re-derive them from the stored events; return events replayed."""
    for table in reversed(t.PROJECTION_TABLES):
        conn.execute(table.delete())
    n = 0
    for batch in iter_stored_events(conn):
        apply_events(conn, batch, replay=True)
        n += len(batch)
        if progress:
            progress(len(batch))
    return n
