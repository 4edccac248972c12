"""PostgreSQL helpers the store benchmarks share: a fresh database per measurement, and the raw-COPY yardstick.

Only the store's public API and the schema are used, so an older checkout of the platform can run
them too (:mod:`bench_apply_ab` measures old and new code side by side with them).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import psycopg
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from sapwood.platform.store import Store
from sapwood.platform.tokens import digest_bytes, pack


def fresh_database(server_url: str) -> tuple[str, str]:
    """A new empty database on the server of ``server_url``: (its URL, the admin DSN to drop it with)."""
    url = make_url(server_url)
    name = f"bench_{uuid.uuid4().hex[:8]}"
    dsn = url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return url.set(database=name).render_as_string(hide_password=False), dsn


def drop_database(dsn: str, url: str) -> None:
    """Drop the database of ``url`` (made by :func:`fresh_database`)."""
    name = make_url(url).database
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def span_bytes(events: list[Any]) -> dict[bytes, bytes]:
    """digest → packed bytes of every distinct non-empty array of ``events`` (what raw COPY writes)."""
    spans: dict[bytes, bytes] = {}
    for e in events:
        for arr in e.array_fields().values():
            if arr.size:
                data = pack(arr)
                spans.setdefault(digest_bytes(data), data)
    return spans


def raw_copy(store: Store, spans: dict[bytes, bytes]) -> float:
    """Seconds to COPY the same (digest, bytes) rows into a plain table, in one transaction (the table
    ``raw_copy`` is left behind: drop it before measuring the store's size)."""
    with store.transaction() as conn:
        conn.execute(sa.text("CREATE TABLE raw_copy (digest bytea PRIMARY KEY, data bytea NOT NULL)"))
        # The storage settings of the store's own spans table (migrations 0001 and 0006).
        conn.execute(sa.text("ALTER TABLE raw_copy ALTER COLUMN data SET STORAGE EXTERNAL"))
        conn.execute(sa.text("ALTER TABLE raw_copy SET (toast_tuple_target = 8160)"))
    t0 = time.perf_counter()
    with store.transaction() as conn:
        raw = conn.connection.driver_connection
        with raw.cursor() as cur, cur.copy("COPY raw_copy (digest, data) FROM STDIN (FORMAT BINARY)") as cp:  # type: ignore[union-attr]
            cp.set_types(["bytea", "bytea"])
            for d, b in spans.items():
                cp.write_row((d, b))
    return time.perf_counter() - t0


__all__ = ["drop_database", "fresh_database", "raw_copy", "span_bytes"]
