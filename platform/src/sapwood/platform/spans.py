"""Content-addressed span storage and path reconstruction.

A span is a packed array (int32 token ids or float32 log-probs) stored once under its
BLAKE2b-128 digest, whichever executions use it. On PostgreSQL new spans go in through a
binary ``COPY``; on SQLite through ``INSERT OR IGNORE``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import sqlalchemy as sa
from psycopg.types.json import Jsonb
from sqlalchemy.dialects import sqlite
from sqlalchemy.engine import Connection

from sapwood.platform import schema as t
from sapwood.platform.errors import UnknownParentError
from sapwood.platform.tokens import TOKEN_DTYPE, TokenArray

_CHUNK = 1000


def existing_digests(conn: Connection, digests: Iterable[bytes]) -> set[bytes]:
    """The subset of ``digests`` already stored."""
    wanted = list(digests)
    found: set[bytes] = set()
    if conn.dialect.name == "postgresql" and wanted:
        rows = conn.execute(sa.text("SELECT digest FROM spans WHERE digest = ANY(:d)"), {"d": wanted})
        return {bytes(r[0]) for r in rows}
    for i in range(0, len(wanted), _CHUNK):
        chunk = wanted[i : i + _CHUNK]
        found.update(bytes(r[0]) for r in conn.execute(sa.select(t.spans.c.digest).where(t.spans.c.digest.in_(chunk))))
    return found


def insert_spans(conn: Connection, spans: dict[bytes, bytes]) -> int:
    """Store the spans not yet stored; return how many were new."""
    if conn.dialect.name == "sqlite":
        stmt = sqlite.insert(t.spans).on_conflict_do_nothing(index_elements=["digest"])
        conn.execute(stmt, [{"digest": d, "data": b} for d, b in spans.items()])
        return len(spans)
    stored = existing_digests(conn, spans)
    missing = [d for d in spans if d not in stored]
    if not missing:
        return 0
    if conn.dialect.name == "postgresql":
        raw = conn.connection.driver_connection
        with raw.cursor() as cur, cur.copy("COPY spans (digest, data) FROM STDIN (FORMAT BINARY)") as copy:  # type: ignore[union-attr]
            copy.set_types(["bytea", "bytea"])
            for d in missing:
                copy.write_row((d, spans[d]))
    else:
        conn.execute(t.spans.insert(), [{"digest": d, "data": spans[d]} for d in missing])
    return len(missing)


#: Below this many rows a plain multi-row INSERT beats setting up a COPY.
COPY_MIN_ROWS = 32


def bulk_insert(conn: Connection, table: sa.Table, rows: list[dict[str, Any]]) -> None:
    """Insert ``rows`` into ``table``: ``COPY`` on PostgreSQL for large batches, else ``INSERT``."""
    if not rows:
        return
    if conn.dialect.name != "postgresql" or len(rows) < COPY_MIN_ROWS:
        conn.execute(table.insert(), rows)
        return
    cols = [c.name for c in table.columns if c.name in rows[0]]
    json_cols = {c.name for c in table.columns if isinstance(c.type, sa.JSON) or "JSON" in str(c.type)}
    raw = conn.connection.driver_connection
    names = ", ".join(f'"{c}"' for c in cols)
    with raw.cursor() as cur, cur.copy(f"COPY {table.name} ({names}) FROM STDIN") as copy:  # type: ignore[union-attr]
        for row in rows:
            copy.write_row([Jsonb(row[c]) if c in json_cols and row[c] is not None else row[c] for c in cols])


def load_spans(conn: Connection, digests: Iterable[bytes]) -> dict[bytes, bytes]:
    """Fetch span bytes by digest."""
    wanted = list({bytes(d) for d in digests})
    out: dict[bytes, bytes] = {}
    for i in range(0, len(wanted), _CHUNK):
        chunk = wanted[i : i + _CHUNK]
        for d, data in conn.execute(sa.select(t.spans.c.digest, t.spans.c.data).where(t.spans.c.digest.in_(chunk))):
            out[bytes(d)] = bytes(data)
    return out


_PATH_SQL = sa.text(
    """
    WITH RECURSIVE path(node_id, parent_id, depth, span_digest) AS (
        SELECT node_id, parent_id, depth, span_digest FROM nodes WHERE node_id = :node_id
        UNION ALL
        SELECT n.node_id, n.parent_id, n.depth, n.span_digest
        FROM nodes n JOIN path p ON n.node_id = p.parent_id
    )
    SELECT p.depth, s.data FROM path p JOIN spans s ON s.digest = p.span_digest ORDER BY p.depth
    """
).bindparams(sa.bindparam("node_id", type_=t.Id))


def path_tokens(conn: Connection, node_id: str) -> TokenArray:
    """Tokens of the context that ends with node ``node_id`` (root → node), as int32 [L]."""
    if conn.dialect.name == "postgresql":
        # One index probe per ancestor: without this the planner hash-joins a full scan of
        # `nodes` on every recursion step whenever it thinks the table is small.
        conn.execute(sa.text("SET LOCAL enable_seqscan = off"))
        conn.execute(sa.text("SET LOCAL enable_hashjoin = off"))
        try:
            rows = conn.execute(_PATH_SQL, {"node_id": node_id}).all()
        finally:
            conn.execute(sa.text("SET LOCAL enable_seqscan TO DEFAULT"))
            conn.execute(sa.text("SET LOCAL enable_hashjoin TO DEFAULT"))
    else:
        rows = conn.execute(_PATH_SQL, {"node_id": node_id}).all()
    if not rows:
        raise UnknownParentError(f"node {node_id} does not exist")
    if len(rows) == 1:
        return np.frombuffer(rows[0][1], dtype=TOKEN_DTYPE)
    return np.frombuffer(b"".join(r[1] for r in rows), dtype=TOKEN_DTYPE)
