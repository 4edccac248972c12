"""Content-addressed span storage and path reconstruction.

A span is a packed array (int32 token ids or float32 log-probs) stored once under the
BLAKE2b-128 digest of its canonical bytes, whichever executions use it. Token spans are
stored narrowed to the bits their largest id needs (:mod:`sapwood.platform.span_encoding`);
readers always get the canonical little-endian bytes back. On PostgreSQL new spans
go in through a binary ``COPY`` (:mod:`sapwood.platform.bulkcopy`); on SQLite through ``INSERT OR IGNORE``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from sapwood.platform import schema as t
from sapwood.platform.errors import UnknownParentError
from sapwood.platform.span_encoding import decode_span, encode_span
from sapwood.platform.tokens import TOKEN_DTYPE, TokenArray

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


def path_cte(
    start: sa.Select[Any],
    dialect: str,
    *,
    link: Callable[[sa.CTE], sa.ColumnElement[Any]] | None = None,
    counter: str | None = None,
    name: str = "path",
) -> sa.CTE:
    """Recursive CTE of the nodes from ``start``'s node up towards the root, one row per node.

    ``start`` selects columns of ``nodes`` (labelled with their column names) for one node; the CTE
    has the same columns. ``link(cte)`` gives the next node's id (default: ``parent_id``, the
    context's path; ``coalesce(parent_id, prev_segment_node)`` crosses compactions). ``counter``
    names a column of ``start`` that each step adds one to instead of reading it from ``nodes``.
    On PostgreSQL each step is an index probe whatever the table's statistics: the step is a
    ``LATERAL`` sub-select with ``LIMIT 1``, which the planner cannot flatten into a hash join over
    a full scan of ``nodes`` (what it picks on a young store: 32 ms for a 179-node path, not 1.4 ms).
    """
    base = start.cte(name, recursive=True)
    nxt = link(base) if link is not None else base.c.parent_id
    names = [c.name for c in base.c if c.name != counter]
    src: Any
    if dialect == "postgresql":
        src = sa.select(*(t.nodes.c[n] for n in names)).where(t.nodes.c.node_id == nxt).limit(1).lateral("up")
        joined = base.join(src, sa.true())
    else:
        src = t.nodes.alias("up")
        joined = base.join(src, src.c.node_id == nxt)
    cols = [(base.c[c.name] + 1).label(c.name) if c.name == counter else src.c[c.name] for c in base.c]
    return base.union_all(sa.select(*cols).select_from(joined))


def _path_spans(path: sa.CTE, *extra: sa.ColumnElement[Any]) -> sa.Select[Any]:
    """The path's spans (encoding, data) in context order, after ``extra`` columns."""
    return (sa.select(*extra, t.spans.c.encoding, t.spans.c.data)
            .select_from(path.join(t.spans, t.spans.c.digest == path.c.span_digest))
            .order_by(path.c.depth))


_PATH_START = sa.select(t.nodes.c.node_id, t.nodes.c.parent_id, t.nodes.c.depth, t.nodes.c.span_digest)
#: Path of a node, and of a model call's input (with the recorded input length on every row), per dialect.
_NODE_PATH = {d: _path_spans(path_cte(_PATH_START.where(t.nodes.c.node_id == sa.bindparam("node_id")), d))
              for d in ("postgresql", "sqlite")}
_CALL_PATH = {
    d: _path_spans(
        path_cte(_PATH_START.join(t.calls, t.calls.c.input_node == t.nodes.c.node_id)
                     .where(t.calls.c.call_id == sa.bindparam("call_id")), d),
        sa.select(t.calls.c.input_len).where(t.calls.c.call_id == sa.bindparam("call_id")).scalar_subquery())
    for d in ("postgresql", "sqlite")
}


def _concat(rows: Sequence[Any], first: int) -> TokenArray:
    """Token ids [L] of path rows whose (encoding, data) start at column ``first``."""
    if len(rows) == 1:
        return np.frombuffer(decode_span(rows[0][first], rows[0][first + 1]), dtype=TOKEN_DTYPE)
    return np.frombuffer(b"".join(decode_span(r[first], r[first + 1]) for r in rows), dtype=TOKEN_DTYPE)


def path_tokens(conn: Connection, node_id: str) -> TokenArray:
    """Tokens of the context that ends with node ``node_id`` (root → node), as int32 [L]."""
    rows = conn.execute(_NODE_PATH[_dialect(conn)], {"node_id": node_id}).all()
    if not rows:
        raise UnknownParentError(f"node {node_id} does not exist")
    return _concat(rows, 0)


def call_input(conn: Connection, call_id: str) -> tuple[TokenArray, int]:
    """A model call's input ids [L] rebuilt from the tree, and the input length it recorded (one query)."""
    rows = conn.execute(_CALL_PATH[_dialect(conn)], {"call_id": call_id}).all()
    if not rows:
        raise UnknownParentError(f"model call {call_id} does not exist")
    return _concat(rows, 1), int(rows[0][0])


def _dialect(conn: Connection) -> str:
    return "postgresql" if conn.dialect.name == "postgresql" else "sqlite"
