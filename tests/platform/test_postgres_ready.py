"""The real PostgreSQL server answers, and ``pg_url`` gives each test a fresh database."""

from __future__ import annotations

import psycopg
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

_DATABASES_SEEN: list[str] = []


def _conninfo(url: str) -> dict[str, object]:
    parsed = make_url(url)
    kwargs: dict[str, object] = {
        "host": parsed.host,
        "port": parsed.port,
        "user": parsed.username,
        "dbname": parsed.database,
    }
    if parsed.password:
        kwargs["password"] = parsed.password
    return kwargs


def test_server_answers_a_real_query(postgres_url: str) -> None:
    engine = create_engine(postgres_url)
    try:
        with engine.connect() as conn:
            assert conn.execute(text("SELECT 40 + 2")).scalar_one() == 42
            version = conn.execute(text("SHOW server_version_num")).scalar_one()
            assert int(version) >= 130000  # DROP DATABASE ... WITH (FORCE) needs 13+
    finally:
        engine.dispose()


def test_pg_url_is_a_fresh_database_that_is_dropped_afterwards(postgres_url: str, pg_url: str) -> None:
    name = make_url(pg_url).database
    assert name
    assert name.startswith("sapwood_test_")
    assert name != make_url(postgres_url).database
    _DATABASES_SEEN.append(name)
    engine = create_engine(pg_url)
    try:
        with engine.begin() as conn:
            assert conn.execute(text("SELECT current_database()")).scalar_one() == name
            tables = conn.execute(
                text("SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'")
            ).scalar_one()
            assert tables == 0
            conn.execute(text("CREATE TABLE t (id int primary key)"))
            conn.execute(text("INSERT INTO t VALUES (1), (2)"))
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM t")).scalar_one() == 2
    finally:
        engine.dispose()
    with psycopg.connect(**_conninfo(postgres_url)) as conn:  # type: ignore[arg-type]
        row = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        assert row is not None


def test_each_test_gets_its_own_database(pg_url: str, postgres_url: str) -> None:
    engine = create_engine(pg_url)
    try:
        with engine.connect() as conn:
            # the table created by the previous test does not exist here
            assert conn.execute(text("SELECT to_regclass('public.t')")).scalar_one() is None
    finally:
        engine.dispose()
    assert make_url(pg_url).database not in _DATABASES_SEEN
    with psycopg.connect(**_conninfo(postgres_url)) as conn:  # type: ignore[arg-type]
        for name in _DATABASES_SEEN:  # earlier tests' databases were dropped at their teardown
            row = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
            assert row is None, f"{name} was not dropped"
