"""How a backend gives a reader one snapshot and a writer its lock before the first read.

The API's request transactions need two guarantees whose SQL differs per backend:

* *statement reads* — each statement sees the latest committed state on its own, with no
  transaction around them (PostgreSQL: autocommit, so no ``BEGIN``/``COMMIT`` round trips;
  SQLite: the connection as it is);
* a *snapshot read* — every statement of the request sees the same committed state
  (PostgreSQL: ``REPEATABLE READ``; SQLite: the connection as it is — the embedded store's
  default driver opens no transaction for reads, so a write committed in between may be seen);
* *serialized migrations* — processes started at once on an empty database upgrade one at a time
  (PostgreSQL: a transaction-scoped advisory lock; SQLite: the embedded store has one process);
* a *serialized write* — a read-then-write transaction (the next score revision, the last admin
  key) cannot interleave with another (PostgreSQL: its row locks; SQLite: ``BEGIN IMMEDIATE``
  takes the database's write lock before the first read).
"""

from __future__ import annotations

from typing import Protocol

from sqlalchemy.engine import Connection


class Transactions(Protocol):
    def statement_reads(self, conn: Connection) -> Connection:
        """``conn`` (not yet in a transaction) set up so that each read statement stands alone (no
        transaction to open and close): for reads of immutable rows, or of one row in one statement."""
        ...

    def snapshot(self, conn: Connection) -> Connection:
        """``conn`` (not yet in a transaction) set up so that its statements all see one snapshot."""
        ...

    def begin_write(self, conn: Connection) -> None:
        """Called first in a write transaction: take what serializes read-then-write transactions."""
        ...

    def serialize_migrations(self, conn: Connection) -> None:
        """Called first in the transaction that upgrades the schema: wait until no other process is
        migrating, so processes started at once on an empty database do not race on the DDL."""
        ...
