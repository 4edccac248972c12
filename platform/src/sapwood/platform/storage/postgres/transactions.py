"""Transaction modes on PostgreSQL: snapshot reads under ``REPEATABLE READ``; writes serialize on row locks."""

from __future__ import annotations

from sqlalchemy.engine import Connection

from sapwood.platform.storage.transactions import Transactions


class PostgresTransactions(Transactions):
    """:class:`~sapwood.platform.storage.transactions.Transactions` for PostgreSQL."""

    def snapshot(self, conn: Connection) -> Connection:
        return conn.execution_options(isolation_level="REPEATABLE READ")

    def begin_write(self, conn: Connection) -> None:
        """Nothing: the statements that need it lock their rows (``FOR UPDATE``)."""
