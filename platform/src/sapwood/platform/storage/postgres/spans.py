"""PostgreSQL span look-ups (one ``bytea[]`` literal, no bind per digest) and plain inserts.

The recorder's bulk path writes spans with a binary ``COPY`` (:mod:`sapwood.platform.storage.postgres.bulkcopy`);
:func:`insert_span_rows` is for small writes (tests, migrations' checks).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from sapwood.platform import schema as t
from sapwood.platform.storage.spans_sql import encode_rows


def existing_digests(conn: Connection, digests: Iterable[bytes]) -> set[bytes]:
    """The subset of ``digests`` already stored (one query)."""
    wanted = list(digests)
    if not wanted:
        return set()
    literal = "{" + ",".join("\\\\x" + d.hex() for d in wanted) + "}"
    rows = conn.execute(sa.text("SELECT digest FROM spans WHERE digest IN (SELECT unnest(CAST(:d AS bytea[])))"),
                        {"d": literal})
    return {bytes(r[0]) for r in rows}


def new_span_rows(conn: Connection, spans: dict[bytes, np.ndarray]) -> list[tuple[bytes, int, bytes]]:
    """(digest, encoding, stored bytes) of the spans not stored yet (COPY cannot skip duplicates)."""
    return encode_rows(spans, existing_digests(conn, spans))


def insert_span_rows(conn: Connection, rows: list[tuple[bytes, int, bytes]]) -> None:
    """Insert span rows (none may be stored already: see :func:`new_span_rows`)."""
    if rows:
        conn.execute(t.spans.insert(), [{"digest": d, "encoding": enc, "data": data} for d, enc, data in rows])
