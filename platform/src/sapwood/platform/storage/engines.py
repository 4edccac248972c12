"""Engines with Sapwood's connection settings, whichever backend a URL names."""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import Engine

from sapwood.platform.storage.postgres.engine import postgres_engine
from sapwood.platform.storage.sqlite.engine import sqlite_engine


def make_engine(url: str, *, statement_timeout_ms: int = 30_000, idle_in_transaction_timeout_ms: int | None = None,
                application_name: str | None = None, connect_timeout_s: int | None = None,
                ping_idle_s: float | None = None, **pool: Any) -> Engine:
    """Engine with Sapwood's connection settings for either backend.

    ``pool`` (e.g. ``pool_size``, ``max_overflow``) sizes the PostgreSQL connection pool; SQLite
    (one file, no server connections to keep) ignores it, so callers need not know the dialect; so does
    it ignore ``idle_in_transaction_timeout_ms`` (PostgreSQL ends a session idle in a transaction that
    long), ``application_name`` (the name a server shows for the connection) and ``connect_timeout_s``
    (seconds to wait for a server), ``ping_idle_s`` (ping only connections idle that long, not each
    checkout). A setting in the URL's query wins over ``application_name`` and ``connect_timeout_s``.
    """
    if url.startswith("sqlite"):
        return sqlite_engine(url)
    return postgres_engine(url, statement_timeout_ms=statement_timeout_ms,
                           idle_in_transaction_timeout_ms=idle_in_transaction_timeout_ms,
                           application_name=application_name, connect_timeout_s=connect_timeout_s,
                           ping_idle_s=ping_idle_s, **pool)
