"""The PostgreSQL engine: psycopg 3, pre-pinged pooled connections, a per-statement timeout."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from sapwood.platform.json_values import load_json


def postgres_engine(url: str, *, statement_timeout_ms: int, idle_in_transaction_timeout_ms: int | None = None,
                    application_name: str | None = None, connect_timeout_s: int | None = None,
                    **pool: Any) -> Engine:
    """Engine on ``url`` (``postgresql://`` is read as psycopg 3's ``postgresql+psycopg://``).

    ``pool`` (e.g. ``pool_size``, ``max_overflow``) sizes the connection pool;
    ``idle_in_transaction_timeout_ms`` (ms) ends a session left idle inside a transaction;
    ``application_name`` (shown in ``pg_stat_activity``) and ``connect_timeout_s`` (s) apply unless the
    URL's query sets them.
    """
    options = f"-c statement_timeout={statement_timeout_ms}"
    if idle_in_transaction_timeout_ms is not None:
        options += f" -c idle_in_transaction_session_timeout={int(idle_in_transaction_timeout_ms)}"
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url[len("postgresql://") :]
    query = sa.engine.make_url(url).query
    connect_args: dict[str, Any] = {"options": options}
    if application_name is not None and "application_name" not in query:
        connect_args["application_name"] = application_name
    if connect_timeout_s is not None and "connect_timeout" not in query:
        connect_args["connect_timeout"] = int(connect_timeout_s)
    return sa.create_engine(
        url,
        pool_pre_ping=True,
        json_deserializer=load_json,  # JSONB prints a float 1e20 as a 21-digit integer: read it as the float
        connect_args=connect_args,
        **pool,
    )
