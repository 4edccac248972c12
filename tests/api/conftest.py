"""Fixtures of the API tests: a PostgreSQL store loaded with small synthetic executions, keys, a client."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sapwood.platform.store import Store
from sapwood.platform.writer import ExecutionWriter
from tests.support.api_client import Keys, TestClient, load_executions, make_client, make_keys


@pytest.fixture
def pg_store(pg_url: str) -> Iterator[Store]:
    store = Store.open(pg_url)
    yield store
    store.close()


@pytest.fixture
def writers(pg_store: Store) -> list[ExecutionWriter]:
    """Four small executions with forks and compaction segments (two timed out, with partial scores)."""
    return load_executions(pg_store, 4)


@pytest.fixture
def keys(pg_store: Store) -> Keys:
    return make_keys(pg_store)


@pytest.fixture
def client(pg_store: Store) -> Iterator[TestClient]:
    with make_client(pg_store) as c:
        yield c


@pytest.fixture(params=["postgresql", "sqlite"])
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """An empty store on each backend."""
    url = request.getfixturevalue("pg_url") if request.param == "postgresql" else f"sqlite:///{tmp_path / 's.db'}"
    store = Store.open(url)
    yield store
    store.close()
