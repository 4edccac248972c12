"""The event recorder for a connection: SQLite's or PostgreSQL's (the one place apply looks at the dialect)."""

from __future__ import annotations

from sqlalchemy.engine import Connection

from sapwood.platform.storage.postgres.recorder import PostgresRecorder
from sapwood.platform.storage.recorder import EventRecorder
from sapwood.platform.storage.sqlite.recorder import SqliteRecorder


def recorder_for(conn: Connection) -> EventRecorder:
    """The :class:`EventRecorder` of ``conn``'s dialect; raises ``ValueError`` for any other database."""
    dialect = conn.dialect.name
    if dialect == "postgresql":
        return PostgresRecorder(conn)
    if dialect == "sqlite":
        return SqliteRecorder(conn)
    raise ValueError(f"no event recorder for the {dialect!r} dialect; expected 'sqlite' or 'postgresql'")


__all__ = ["recorder_for"]
