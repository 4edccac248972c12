"""Insert rows straight into a table (test set-up): ``COPY`` on PostgreSQL for large batches, else ``INSERT``."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from sapwood.platform.storage.postgres.bulkcopy import COPY_MIN_ROWS, send, text_payload


def bulk_insert(conn: Connection, table: sa.Table, rows: list[dict[str, Any]]) -> None:
    """Insert ``rows`` into ``table`` now: ``COPY`` on PostgreSQL for large batches, else ``INSERT``."""
    if not rows:
        return
    if conn.dialect.name != "postgresql" or len(rows) < COPY_MIN_ROWS:
        conn.execute(table.insert(), rows)
        return
    send(conn, text_payload(table, rows))
