"""Transaction modes on PostgreSQL: snapshot reads under ``REPEATABLE READ``; writes serialize on row locks."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.engine import Connection

from sapwood.platform.storage.transactions import Transactions

#: The advisory-lock key that serializes schema upgrades (any fixed 64-bit number; "sapwood\0" as bytes).
MIGRATION_LOCK_KEY = 0x73617077_6F6F6400


class PostgresTransactions(Transactions):
    """:class:`~sapwood.platform.storage.transactions.Transactions` for PostgreSQL."""

    def statement_reads(self, conn: Connection) -> Connection:
        """Autocommit (set on the driver connection, no round trip; reset when it returns to the pool):
        a two-statement read saves the ``BEGIN`` and ``COMMIT`` round trips, and psycopg keeps its
        prepared statements (it drops them on a rollback)."""
        return conn.execution_options(isolation_level="AUTOCOMMIT")

    def snapshot(self, conn: Connection) -> Connection:
        return conn.execution_options(isolation_level="REPEATABLE READ")

    def begin_write(self, conn: Connection) -> None:
        """Nothing: the statements that need it lock their rows (``FOR UPDATE``)."""

    def serialize_migrations(self, conn: Connection) -> None:
        """``pg_advisory_xact_lock``: held until the upgrade's transaction ends; a second process waits,
        then finds the schema at head."""
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
