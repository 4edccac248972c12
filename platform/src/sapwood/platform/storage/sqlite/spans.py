"""SQLite span writes: no look-up before writing, ``INSERT OR IGNORE`` keeps the first copy."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from sqlalchemy.dialects import sqlite
from sqlalchemy.engine import Connection

from sapwood.platform import schema as t
from sapwood.platform.storage.spans_sql import encode_rows, existing_digests_chunked


def existing_digests(conn: Connection, digests: Iterable[bytes]) -> set[bytes]:
    """The subset of ``digests`` already stored."""
    return existing_digests_chunked(conn, list(digests))


def new_span_rows(conn: Connection, spans: dict[bytes, np.ndarray]) -> list[tuple[bytes, int, bytes]]:
    """Every span encoded: a look-up would cost more than the ignored duplicate inserts."""
    return encode_rows(spans)


def insert_span_rows(conn: Connection, rows: list[tuple[bytes, int, bytes]]) -> None:
    """``INSERT OR IGNORE`` the rows (a span stored meanwhile is kept as it is: same digest, same bytes)."""
    if rows:
        values = [{"digest": d, "encoding": enc, "data": data} for d, enc, data in rows]
        conn.execute(sqlite.insert(t.spans).on_conflict_do_nothing(index_elements=["digest"]), values)
