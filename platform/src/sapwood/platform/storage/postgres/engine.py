"""The PostgreSQL engine: psycopg 3, pre-pinged pooled connections, a per-statement timeout."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from sapwood.platform.json_values import load_json


def postgres_engine(url: str, *, statement_timeout_ms: int, idle_in_transaction_timeout_ms: int | None = None,
                    **pool: Any) -> Engine:
    """Engine on ``url`` (``postgresql://`` is read as psycopg 3's ``postgresql+psycopg://``).

    ``pool`` (e.g. ``pool_size``, ``max_overflow``) sizes the connection pool;
    ``idle_in_transaction_timeout_ms`` (ms) ends a session left idle inside a transaction.
    """
    options = f"-c statement_timeout={statement_timeout_ms}"
    if idle_in_transaction_timeout_ms is not None:
        options += f" -c idle_in_transaction_session_timeout={int(idle_in_transaction_timeout_ms)}"
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url[len("postgresql://") :]
    return sa.create_engine(
        url,
        pool_pre_ping=True,
        json_deserializer=load_json,  # JSONB prints a float 1e20 as a 21-digit integer: read it as the float
        connect_args={"options": options},
        **pool,
    )
