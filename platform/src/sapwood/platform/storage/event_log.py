"""The event log as stored: chunks of ``events`` rows in append order, the projections' canonical hash,
and clearing the projections before a rebuild (:mod:`sapwood.platform.projection` drives the rebuild)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from sapwood.platform import schema as t


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


def event_row_chunks(conn: Connection, *, chunk: int = 2000, where: Any = None) -> Iterator[list[Any]]:
    """``events`` rows in append order (``pos``), ``chunk`` at a time; ``where``: an extra filter."""
    after = 0
    while True:
        q = sa.select(t.events).where(t.events.c.pos > after).order_by(t.events.c.pos).limit(chunk)
        if where is not None:
            q = q.where(where)
        rows = conn.execute(q).all()
        if not rows:
            return
        yield list(rows)
        after = rows[-1].pos


def clear_projections(conn: Connection) -> None:
    """Delete every projection row (children first); the events stay."""
    for table in reversed(t.PROJECTION_TABLES):
        conn.execute(table.delete())
