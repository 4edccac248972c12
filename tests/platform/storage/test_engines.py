"""``make_engine``'s connection settings: what the server sees for a PostgreSQL connection; SQLite ignores them."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

from sapwood.platform.storage.engines import make_engine


def _settings(url: str, **options: object) -> tuple[str, str]:
    engine = make_engine(url, **options)  # type: ignore[arg-type]
    try:
        with engine.connect() as conn:
            name = conn.execute(sa.text("SHOW application_name")).scalar_one()
            dsn = conn.connection.dbapi_connection.info.dsn  # type: ignore[union-attr]
    finally:
        engine.dispose()
    return name, dsn


@pytest.mark.postgres
def test_application_name_and_connect_timeout_reach_the_server(pg_url: str) -> None:
    name, dsn = _settings(pg_url, application_name="sapwood-ingest", connect_timeout_s=5)
    assert name == "sapwood-ingest"
    assert "connect_timeout=5" in dsn


@pytest.mark.postgres
def test_the_urls_own_settings_win(pg_url: str) -> None:
    sep = "&" if "?" in pg_url else "?"
    name, dsn = _settings(f"{pg_url}{sep}application_name=from-url&connect_timeout=9",
                          application_name="sapwood-ingest", connect_timeout_s=5)
    assert name == "from-url"
    assert "connect_timeout=9" in dsn


@pytest.mark.postgres
def test_without_options_the_server_sees_no_sapwood_name(pg_url: str) -> None:
    name, _ = _settings(pg_url)
    assert name != "sapwood-ingest"


def test_sqlite_ignores_the_server_settings(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'x.db'}", application_name="a", connect_timeout_s=5,
                         idle_in_transaction_timeout_ms=10)
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT 1")).scalar_one() == 1
    engine.dispose()
