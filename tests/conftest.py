"""Session fixtures for real PostgreSQL and Apache Kafka servers.

Where the servers come from, in order:

1. ``SAPWOOD_TEST_DATABASE_URL`` / ``SAPWOOD_TEST_KAFKA_BOOTSTRAP`` (``scripts/test``
   sets both after ``python scripts/services.py start``; any reachable server works);
2. a testcontainers container, when a Docker engine actually answers;
3. otherwise the test fails when ``CI`` is set, and is skipped (with the reason) elsewhere.

Tests that use ``postgres_url``/``pg_url``/``kafka_bootstrap`` (directly or
through other fixtures) are marked ``postgres``/``kafka`` automatically. Tests
marked ``slow`` run only with ``--runslow``.
"""

from __future__ import annotations

import os
import uuid
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

POSTGRES_FIXTURES = frozenset({"postgres_url", "pg_url"})
KAFKA_FIXTURES = frozenset({"kafka_bootstrap"})
SLOW_SKIP_REASON = "slow test: run with --runslow"
NO_SERVER_PREFIX = "no server:"

POSTGRES_IMAGE = "postgres:16"
KAFKA_IMAGE = "confluentinc/cp-kafka:7.6.0"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--runslow", action="store_true", default=False, help="also run tests marked slow")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    run_slow = config.getoption("--runslow")
    skip_slow = pytest.mark.skip(reason=SLOW_SKIP_REASON)
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if names & POSTGRES_FIXTURES:
            item.add_marker(pytest.mark.postgres)
        if names & KAFKA_FIXTURES:
            item.add_marker(pytest.mark.kafka)
        markers = sorted({m.name for m in item.iter_markers()} & {"postgres", "kafka", "vllm", "slow"})
        if markers:
            # written into the JUnit XML: scripts/test fails if a server test was skipped
            item.user_properties.append(("sapwood_markers", ",".join(markers)))
        if "slow" in markers and not run_slow:
            item.add_marker(skip_slow)


def _no_server(what: str, env_var: str) -> None:
    message = (
        f"{NO_SERVER_PREFIX} {what} needs {env_var} (run `python scripts/services.py start` and source "
        f".services/env, or use scripts/test) or a running Docker engine for testcontainers"
    )
    if os.environ.get("CI"):
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def _docker_available() -> bool:
    try:
        import docker
    except ImportError:
        return False
    try:
        client = docker.from_env(timeout=5)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:
        return False


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """SQLAlchemy URL (``postgresql+psycopg://...``) of a real PostgreSQL server's admin database."""
    url = os.environ.get("SAPWOOD_TEST_DATABASE_URL")
    if url:
        yield url
        return
    if not _docker_available():
        _no_server("PostgreSQL", "SAPWOOD_TEST_DATABASE_URL")
    from testcontainers.community.postgres import PostgresContainer

    with PostgresContainer(POSTGRES_IMAGE, driver="psycopg") as container:
        yield container.get_connection_url()


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """``host:port`` of a real Apache Kafka broker."""
    bootstrap = os.environ.get("SAPWOOD_TEST_KAFKA_BOOTSTRAP")
    if bootstrap:
        yield bootstrap
        return
    if not _docker_available():
        _no_server("Apache Kafka", "SAPWOOD_TEST_KAFKA_BOOTSTRAP")
    from testcontainers.community.kafka import KafkaContainer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        container = KafkaContainer(KAFKA_IMAGE).with_kraft()
    with container:
        yield container.get_bootstrap_server()


def _psycopg_kwargs(url: str) -> dict[str, Any]:
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    kwargs: dict[str, Any] = {
        "host": parsed.host or "127.0.0.1",
        "port": parsed.port or 5432,
        "user": parsed.username or "postgres",
        "dbname": parsed.database or "postgres",
        "autocommit": True,
    }
    if parsed.password:
        kwargs["password"] = parsed.password
    return kwargs


@pytest.fixture
def pg_url(postgres_url: str) -> Iterator[str]:
    """A fresh, empty database on the test server for this test alone; dropped afterwards."""
    import psycopg
    from psycopg import sql
    from sqlalchemy.engine import make_url

    name = f"sapwood_test_{uuid.uuid4().hex[:16]}"
    admin = _psycopg_kwargs(postgres_url)
    with psycopg.connect(**admin) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield make_url(postgres_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with psycopg.connect(**admin) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
