"""The event recorder for a connection: SQLite's or PostgreSQL's (the one place apply looks at the dialect)."""

from __future__ import annotations

from sqlalchemy.engine import Connection

from sapwood.platform.storage.dialects import for_dialect
from sapwood.platform.storage.postgres.recorder import PostgresRecorder
from sapwood.platform.storage.recorder import EventRecorder
from sapwood.platform.storage.sqlite.recorder import SqliteRecorder


def event_recorder(conn: Connection) -> EventRecorder:
    """The :class:`EventRecorder` of ``conn``'s dialect; raises ``ValueError`` for any other database."""
    return for_dialect(conn, "event recorder", sqlite=lambda: SqliteRecorder(conn),
                       postgresql=lambda: PostgresRecorder(conn))


__all__ = ["event_recorder"]
