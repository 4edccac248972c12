"""The run queue on SQLite: no row locks; a conditional update decides each claim.

SQLite serializes writers on the whole database, so a claim's read takes no locks: the UPDATE that
stamps the items re-checks that they are still available, and the claimer keeps only the rows that
carry its stamp (:meth:`~sapwood.platform.storage.runs_sql.SqlRunQueue.claim`).
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import sqlite
from sqlalchemy.engine import Connection

from sapwood.platform import schema as t
from sapwood.platform.storage.runs_sql import SqlRunQueue


class SQLiteRunQueue(SqlRunQueue):
    """:class:`~sapwood.platform.storage.runs.RunQueue` for SQLite."""

    def lock_candidates(self, q: sa.Select[Any], *, skip_locked: bool) -> sa.Select[Any]:
        return q  # no row locks: the database's write lock and the conditional update serialize claims

    def insert_new_items(self, conn: Connection, rows: list[dict[str, Any]]) -> None:
        conn.execute(sqlite.insert(t.run_items).on_conflict_do_nothing(index_elements=["run_id", "execution_id"]),
                     rows)
