"""The SQLite event applier: plan the batch (portable look-ups), then plain multi-row ``INSERT`` statements.

SQLite runs in-process, so nothing overlaps: new spans are written after planning with
``INSERT OR IGNORE`` (a span another batch stored meanwhile is simply kept), then every table's rows.
"""

from __future__ import annotations

from sapwood.platform.phase_timer import PhaseTimer
from sapwood.platform.planner.ports import PlannedWrites
from sapwood.platform.storage.applier_sql import SqlApplier, insert_rows, write_updates
from sapwood.platform.storage.sqlite.spans import insert_span_rows, new_span_rows


class SqliteApplier(SqlApplier):
    """:class:`~sapwood.platform.storage.applier.EventApplier` on a SQLite connection."""

    def write(self, writes: PlannedWrites, timer: PhaseTimer) -> None:
        conn = self.conn
        span_rows = new_span_rows(conn, writes.spans) if not writes.replay and writes.spans else []
        timer.lap("spans")
        timer.add("payloads", 0.0)
        insert_span_rows(conn, span_rows)
        for table, rows in writes.inserts():
            insert_rows(conn, table, rows)
        write_updates(conn, writes)
        timer.lap("store")


__all__ = ["SqliteApplier"]
