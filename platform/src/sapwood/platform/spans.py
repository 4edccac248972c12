"""Content-addressed span storage.

A span is a packed array (int32 token ids or float32 log-probs) stored once under the
BLAKE2b-128 digest of its canonical bytes, whichever executions use it. Token spans are
stored narrowed to the bits their largest id needs (:mod:`sapwood.platform.span_encoding`);
readers always get the canonical little-endian bytes back. On PostgreSQL new spans
go in through a binary ``COPY`` (:mod:`sapwood.platform.bulkcopy`); on SQLite through ``INSERT OR IGNORE``.
Contexts are rebuilt from the tree by the tree reader (:mod:`sapwood.platform.storage.trees`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from sapwood.platform import schema as t
from sapwood.platform.span_encoding import decode_span, encode_span
from sapwood.platform.storage.trees import tree_reader
from sapwood.platform.tokens import TokenArray

_CHUNK = 1000

def uuid_in(column: sa.ColumnElement[Any], param: str) -> sa.ColumnElement[bool]:
    """``column IN :param`` for a UUID column on PostgreSQL, ``param`` bound to one ``uuid[]`` literal
    (:func:`sapwood.platform.uuids.uuid_array_literal`).

    Faster than a bind per value or a driver-adapted list (both cost Python work per element), and the
    statement it belongs to can be built once and reused.
    """
    # IN (SELECT unnest(...)): a semi-join the planner can hash or drive through the index;
    # `= ANY(array)` would compare every scanned row with the whole array.
    array = sa.cast(sa.bindparam(param, type_=sa.Text), postgresql.ARRAY(sa.Uuid))
    return column.in_(sa.select(sa.func.unnest(array)))


def existing_digests(conn: Connection, digests: Iterable[bytes]) -> set[bytes]:
    """The subset of ``digests`` already stored."""
    wanted = list(digests)
    found: set[bytes] = set()
    if conn.dialect.name == "postgresql" and wanted:
        literal = "{" + ",".join("\\\\x" + d.hex() for d in wanted) + "}"  # one bytea[] literal, no per-item binds
        rows = conn.execute(sa.text("SELECT digest FROM spans WHERE digest IN (SELECT unnest(CAST(:d AS bytea[])))"),
                            {"d": literal})
        return {bytes(r[0]) for r in rows}
    for i in range(0, len(wanted), _CHUNK):
        chunk = wanted[i : i + _CHUNK]
        found.update(bytes(r[0]) for r in conn.execute(sa.select(t.spans.c.digest).where(t.spans.c.digest.in_(chunk))))
    return found


def new_span_rows(conn: Connection, spans: dict[bytes, np.ndarray]) -> list[tuple[bytes, int, bytes]]:
    """(digest, encoding, stored bytes) of the spans (digest → canonical array) not stored yet."""
    stored = existing_digests(conn, spans) if conn.dialect.name != "sqlite" else set()
    return [(d, *encode_span(arr)) for d, arr in spans.items() if d not in stored]


def insert_span_rows(conn: Connection, rows: list[tuple[bytes, int, bytes]]) -> None:
    """Insert span rows with SQLAlchemy (SQLite: ``INSERT OR IGNORE``); PostgreSQL uses :mod:`bulkcopy`."""
    if not rows:
        return
    values = [{"digest": d, "encoding": enc, "data": data} for d, enc, data in rows]
    if conn.dialect.name == "sqlite":
        conn.execute(sqlite.insert(t.spans).on_conflict_do_nothing(index_elements=["digest"]), values)
    else:
        conn.execute(t.spans.insert(), values)


def load_spans(conn: Connection, digests: Iterable[bytes]) -> dict[bytes, bytes]:
    """Fetch span bytes by digest."""
    wanted = list({bytes(d) for d in digests})
    out: dict[bytes, bytes] = {}
    for i in range(0, len(wanted), _CHUNK):
        chunk = wanted[i : i + _CHUNK]
        q = sa.select(t.spans.c.digest, t.spans.c.encoding, t.spans.c.data).where(t.spans.c.digest.in_(chunk))
        for d, enc, data in conn.execute(q):
            out[bytes(d)] = decode_span(enc, data)
    return out


def path_tokens(conn: Connection, node_id: str) -> TokenArray:
    """Tokens of the context that ends with node ``node_id`` (root → node), as int32 [L] (the tree reader's)."""
    return tree_reader(conn).context_tokens(conn, node_id)


def call_input(conn: Connection, call_id: str) -> tuple[TokenArray, int]:
    """A model call's input ids [L] rebuilt from the tree, and the input length it recorded (one query)."""
    return tree_reader(conn).call_input(conn, call_id)
