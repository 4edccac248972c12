"""The dead-letter table: records ingest could not apply, with the reason and the original bytes.

Written in the same transaction as the batch they came in (exactly once, authoritative); the same SQL on
SQLite and PostgreSQL, so one module serves both. Text fields are cut to their column sizes and ids that
are not UUIDs are stored as NULL: a dead letter is kept whatever it carries.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any, Protocol

from sqlalchemy.engine import Connection

from sapwood.platform import schema as t
from sapwood.platform.uuids import canonical_uuid


class DeadLetterRow(Protocol):
    """What the table keeps of one dead letter (ingest's ``DeadLetter`` has these fields)."""

    reason: str
    message: str
    payload: bytes
    source: str
    key: bytes | None
    event_id: str | None
    execution_id: str | None


def _uuid_or_none(value: Any) -> str | None:
    try:
        return canonical_uuid(str(value)) if value else None
    except (ValueError, TypeError, AttributeError):
        return None


def key_text(key: bytes | None) -> str | None:
    """A record key as ASCII text (TITO records are keyed by execution id), None if it is not ASCII."""
    try:
        return key.decode("ascii") if key else None
    except UnicodeDecodeError:
        return None


def insert_dead_letters(conn: Connection, letters: Iterable[DeadLetterRow]) -> int:
    """Insert ``letters`` into ``dead_letters`` in the caller's transaction; returns how many."""
    now = time.time()
    rows = [
        {
            "received_at": now,
            "reason": dl.reason[:32],
            "message": dl.message[:4000],
            "event_id": _uuid_or_none(dl.event_id),
            "execution_id": _uuid_or_none(dl.execution_id) or _uuid_or_none(key_text(dl.key)),
            "source": dl.source[:256],
            "payload": dl.payload,
            "record_key": dl.key,
        }
        for dl in letters
    ]
    if rows:
        conn.execute(t.dead_letters.insert(), rows)
    return len(rows)


__all__ = ["DeadLetterRow", "insert_dead_letters", "key_text"]
