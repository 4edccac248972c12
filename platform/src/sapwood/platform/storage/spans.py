"""Content-addressed span storage.

A span is a packed array (int32 token ids or float32 log-probs) stored once under the
BLAKE2b-128 digest of its canonical bytes, whichever executions use it. Token spans are
stored narrowed to the bits their largest id needs (:mod:`sapwood.platform.span_encoding`);
readers always get the canonical little-endian bytes back. On PostgreSQL new spans go in
through a binary ``COPY`` (:mod:`sapwood.platform.storage.postgres.bulkcopy`); on SQLite through
``INSERT OR IGNORE``.
Contexts are rebuilt from the tree by the tree reader (:mod:`sapwood.platform.storage.trees`).
"""

from __future__ import annotations

from collections.abc import Iterable
from types import ModuleType

import numpy as np
from sqlalchemy.engine import Connection

from sapwood.platform.storage.dialects import for_dialect
from sapwood.platform.storage.spans_sql import load_spans as load_spans  # re-exported: the one span read


def existing_digests(conn: Connection, digests: Iterable[bytes]) -> set[bytes]:
    """The subset of ``digests`` already stored."""
    return _span_writes(conn).existing_digests(conn, digests)


def new_span_rows(conn: Connection, spans: dict[bytes, np.ndarray]) -> list[tuple[bytes, int, bytes]]:
    """(digest, encoding, stored bytes) of the spans (digest → canonical array) that need writing."""
    return _span_writes(conn).new_span_rows(conn, spans)


def insert_span_rows(conn: Connection, rows: list[tuple[bytes, int, bytes]]) -> None:
    """Insert span rows with SQLAlchemy (SQLite: ``INSERT OR IGNORE``); PostgreSQL's recorder uses :mod:`bulkcopy`."""
    _span_writes(conn).insert_span_rows(conn, rows)


def _span_writes(conn: Connection) -> ModuleType:
    from sapwood.platform.storage.postgres import spans as pg_spans
    from sapwood.platform.storage.sqlite import spans as sqlite_spans

    return for_dialect(conn, "span store", sqlite=lambda: sqlite_spans, postgresql=lambda: pg_spans)

