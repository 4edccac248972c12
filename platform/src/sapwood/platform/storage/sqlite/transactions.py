"""Transaction modes on SQLite: reads as they are; writes take the database lock with ``BEGIN IMMEDIATE``."""

from __future__ import annotations

from sqlalchemy.engine import Connection

from sapwood.platform.storage.transactions import Transactions


class SQLiteTransactions(Transactions):
    """:class:`~sapwood.platform.storage.transactions.Transactions` for SQLite."""

    def statement_reads(self, conn: Connection) -> Connection:
        return conn

    def snapshot(self, conn: Connection) -> Connection:
        return conn

    def begin_write(self, conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    def serialize_migrations(self, conn: Connection) -> None:
        """Nothing: the embedded store is one process's (concurrent first starts are a PostgreSQL case)."""
