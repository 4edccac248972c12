"""The run queue on PostgreSQL: claims read with ``FOR UPDATE SKIP LOCKED``.

Concurrent learners each lock the first available items no other transaction has locked, so they
never wait on each other and never take the same item; completing an item locks it (``FOR UPDATE``)
so a completion and a takeover after an expired lease cannot both succeed.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Connection

from sapwood.platform import schema as t
from sapwood.platform.storage.runs_sql import SqlRunQueue


class PostgresRunQueue(SqlRunQueue):
    """:class:`~sapwood.platform.storage.runs.RunQueue` for PostgreSQL."""

    def lock_candidates(self, q: sa.Select[Any], *, skip_locked: bool) -> sa.Select[Any]:
        return q.with_for_update(skip_locked=skip_locked)

    def insert_new_items(self, conn: Connection, rows: list[dict[str, Any]]) -> None:
        conn.execute(postgresql.insert(t.run_items)
                     .on_conflict_do_nothing(index_elements=["run_id", "execution_id"]), rows)
