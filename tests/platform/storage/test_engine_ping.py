"""``make_engine(ping_idle_s=...)``: a pooled connection is pinged only after it sat idle that long, and one
the server dropped while it sat is replaced before a statement runs on it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from sapwood.platform.storage.engines import make_engine

pytestmark = pytest.mark.postgres


def _counting_pings(engine: Engine) -> list[int]:
    """Record each ping the dialect sends (the real ping still runs)."""
    pings: list[int] = []
    real = engine.dialect.do_ping

    def ping(dbapi_conn: object) -> bool:
        pings.append(1)
        return real(dbapi_conn)

    engine.dialect.do_ping = ping  # type: ignore[method-assign]
    return pings


@pytest.fixture
def admin(pg_url: str) -> Iterator[Engine]:
    engine = make_engine(pg_url)
    yield engine
    engine.dispose()


def _pid(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.text("SELECT pg_backend_pid()")).scalar_one())


def _terminate(admin: Engine, pid: int) -> None:
    with admin.connect() as conn:
        assert conn.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": pid}).scalar_one()
    # the backend is gone once the server no longer lists it (each look in a transaction of its own: the
    # statistics views keep one snapshot per transaction)
    for _ in range(1000):
        with admin.connect() as conn:
            if conn.execute(sa.text("SELECT count(*) FROM pg_stat_activity WHERE pid = :pid"),
                            {"pid": pid}).scalar_one() == 0:
                return
            conn.execute(sa.text("SELECT pg_sleep(0.01)"))
    raise AssertionError(f"backend {pid} still listed")


def test_a_connection_reused_at_once_is_not_pinged(pg_url: str) -> None:
    engine = make_engine(pg_url, pool_size=1, max_overflow=0, ping_idle_s=3600)
    try:
        pings = _counting_pings(engine)
        first = _pid(engine)
        assert [_pid(engine) for _ in range(5)] == [first] * 5  # the same pooled connection each time
        assert pings == []
    finally:
        engine.dispose()


def test_without_ping_idle_s_every_checkout_is_pinged(pg_url: str) -> None:
    engine = make_engine(pg_url, pool_size=1, max_overflow=0)
    try:
        pings = _counting_pings(engine)
        for _ in range(3):
            _pid(engine)
        assert len(pings) == 2  # every checkout but the one that opened the connection
    finally:
        engine.dispose()


def test_an_idle_connection_the_server_dropped_is_replaced(pg_url: str, admin: Engine) -> None:
    engine = make_engine(pg_url, pool_size=1, max_overflow=0, ping_idle_s=0)
    try:
        pings = _counting_pings(engine)
        dropped = _pid(engine)
        _terminate(admin, dropped)  # what a server restart does to a connection idle in the pool
        assert _pid(engine) != dropped  # pinged, found dead, replaced: the statement ran on a new connection
        assert pings == [1]
    finally:
        engine.dispose()


def test_a_dropped_connection_reused_at_once_fails_and_the_next_checkout_reconnects(
        pg_url: str, admin: Engine) -> None:
    """The price of skipping the ping: a connection dropped within ``ping_idle_s`` fails one statement
    (the API answers 503), and the pool is refilled with live connections for the next one."""
    engine = make_engine(pg_url, pool_size=1, max_overflow=0, ping_idle_s=3600)
    try:
        dropped = _pid(engine)
        _terminate(admin, dropped)
        with pytest.raises(sa.exc.OperationalError) as err:
            _pid(engine)
        assert err.value.connection_invalidated
        assert _pid(engine) != dropped
    finally:
        engine.dispose()
