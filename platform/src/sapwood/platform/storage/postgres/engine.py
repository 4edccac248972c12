"""The PostgreSQL engine: psycopg 3, pre-pinged pooled connections, a per-statement timeout."""

from __future__ import annotations

import time
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event as sa_event
from sqlalchemy.engine import Engine

from sapwood.platform.json_values import load_json


def postgres_engine(url: str, *, statement_timeout_ms: int, idle_in_transaction_timeout_ms: int | None = None,
                    application_name: str | None = None, connect_timeout_s: int | None = None,
                    ping_idle_s: float | None = None, **pool: Any) -> Engine:
    """Engine on ``url`` (``postgresql://`` is read as psycopg 3's ``postgresql+psycopg://``).

    ``pool`` (e.g. ``pool_size``, ``max_overflow``) sizes the connection pool;
    ``idle_in_transaction_timeout_ms`` (ms) ends a session left idle inside a transaction;
    ``application_name`` (shown in ``pg_stat_activity``) and ``connect_timeout_s`` (s) apply unless the
    URL's query sets them.

    A connection is pinged (``SELECT 1``, one round trip) when it leaves the pool, so a connection the
    server dropped (a restart) is replaced before a statement fails on it. With ``ping_idle_s`` (s) only
    connections that sat in the pool longer than that are pinged: under load a server reuses its
    connections within milliseconds, and the ping was a third of a cached-plan read's round trips.
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
    engine = sa.create_engine(
        url,
        pool_pre_ping=ping_idle_s is None,
        json_deserializer=load_json,  # JSONB prints a float 1e20 as a 21-digit integer: read it as the float
        connect_args=connect_args,
        **pool,
    )
    if ping_idle_s is not None:
        _ping_after_idle(engine, ping_idle_s)
    return engine


_RETURNED = "sapwood_returned_at"  # connection record info: monotonic seconds it last returned to the pool


def _ping_after_idle(engine: Engine, idle_s: float) -> None:
    """Ping a connection on checkout only if it was idle in the pool for more than ``idle_s`` seconds;
    one that fails the ping is replaced (SQLAlchemy's ``DisconnectionError`` from a checkout hook)."""

    @sa_event.listens_for(engine, "checkin")
    def _returned(_dbapi_conn: Any, record: Any) -> None:
        if record is not None:
            record.info[_RETURNED] = time.monotonic()

    @sa_event.listens_for(engine, "checkout")
    def _ping_if_idle(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        returned = record.info.get(_RETURNED)
        if returned is None or time.monotonic() - returned <= idle_s:
            return  # just connected, or back in the pool a moment ago
        try:
            alive = engine.dialect.do_ping(dbapi_conn)
        except engine.dialect.loaded_dbapi.Error as exc:
            raise sa.exc.DisconnectionError(f"connection idle {idle_s} s failed its ping: {exc}") from exc
        if not alive:
            raise sa.exc.DisconnectionError("connection failed its ping")
