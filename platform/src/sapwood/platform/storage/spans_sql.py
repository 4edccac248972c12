"""Span reads and writes both dialects share (chunked ``IN`` look-ups, loading by digest, encoding of new rows)."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from sapwood.platform import schema as t
from sapwood.platform.span_encoding import decode_span, encode_span

CHUNK = 1000
"""Digests per ``IN (...)`` look-up (bind parameters per statement stay well below SQLite's limit)."""


def existing_digests_chunked(conn: Connection, wanted: list[bytes]) -> set[bytes]:
    """The subset of ``wanted`` already stored, looked up ``CHUNK`` digests at a time."""
    found: set[bytes] = set()
    for i in range(0, len(wanted), CHUNK):
        chunk = wanted[i : i + CHUNK]
        found.update(bytes(r[0]) for r in conn.execute(sa.select(t.spans.c.digest).where(t.spans.c.digest.in_(chunk))))
    return found


def encode_rows(spans: dict[bytes, np.ndarray], skip: Iterable[bytes] = ()) -> list[tuple[bytes, int, bytes]]:
    """(digest, encoding, stored bytes) of ``spans`` (digest → canonical array) not in ``skip``."""
    stored = set(skip)
    return [(d, *encode_span(arr)) for d, arr in spans.items() if d not in stored]


#: Spans (digest, encoding, data) by the expanding ``digests`` (built once, not per look-up).
_SPANS_SQL = (sa.select(t.spans.c.digest, t.spans.c.encoding, t.spans.c.data)
              .where(t.spans.c.digest.in_(sa.bindparam("digests", expanding=True))))


def load_spans(conn: Connection, digests: Iterable[bytes]) -> dict[bytes, bytes]:
    """Fetch decoded span bytes by digest, ``CHUNK`` digests a statement."""
    wanted = list({bytes(d) for d in digests})
    out: dict[bytes, bytes] = {}
    for i in range(0, len(wanted), CHUNK):
        for d, enc, data in conn.execute(_SPANS_SQL, {"digests": wanted[i : i + CHUNK]}):
            out[bytes(d)] = decode_span(enc, data)
    return out
