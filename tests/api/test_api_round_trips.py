"""Round trips of the hot read routes on PostgreSQL: statements per request, no transaction around
statement reads, one snapshot transaction for trees, and no route state built on a worker's first request."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import fastapi.routing
import pytest
import sqlalchemy as sa

from sapwood.api import ApiSettings, create_app
from sapwood.platform.store import Store
from sapwood.platform.writer import ExecutionWriter
from tests.support.api_client import Keys, TestClient, calls_of

pytestmark = pytest.mark.postgres


@contextmanager
def statements(store: Store) -> Iterator[list[tuple[bool, Any]]]:
    """(driver autocommit, isolation level) of every statement the store's engine runs meanwhile."""
    seen: list[tuple[bool, Any]] = []

    def record(conn: Any, _cursor: Any, _sql: str, _params: Any, _context: Any, _many: bool) -> None:
        dbapi = conn.connection.dbapi_connection
        level = dbapi.isolation_level
        seen.append((bool(dbapi.autocommit), getattr(level, "name", level)))

    sa.event.listen(store.engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        sa.event.remove(store.engine, "before_cursor_execute", record)


@pytest.fixture
def cold(pg_store: Store) -> Iterator[TestClient]:
    with TestClient(create_app(ApiSettings(api_cache_bytes=0), store=pg_store), raise_server_exceptions=False) as c:
        yield c


def _get(client: TestClient, keys: Keys, url: str) -> None:
    r = client.get(url, headers=keys.headers("read"))
    assert r.status_code == 200, r.text


def test_an_audit_is_one_statement_outside_a_transaction(cold: TestClient, keys: Keys, pg_store: Store,
                                                          writers: list[ExecutionWriter]) -> None:
    call = calls_of(writers[0])[-1]
    _get(cold, keys, f"/v1/calls/{call.event_id}/audit")  # the key looked up and cached
    with statements(pg_store) as seen:
        _get(cold, keys, f"/v1/calls/{call.event_id}/audit")
    assert [autocommit for autocommit, _ in seen] == [True]  # one round trip: no BEGIN, no COMMIT


def test_a_trajectory_page_is_four_statements_outside_a_transaction(cold: TestClient, keys: Keys, pg_store: Store,
                                                                    writers: list[ExecutionWriter]) -> None:
    """The path, the leaf's execution facts, the spans, the log-probs with their spans: whatever the pieces."""
    leaf = writers[1].leaves()[-1]  # its path is not cached yet
    _get(cold, keys, f"/v1/executions/{writers[1].execution_id}")
    with statements(pg_store) as seen:
        _get(cold, keys, f"/v1/nodes/{leaf}/trajectory?limit=65536")
    assert len(seen) == 4
    assert all(autocommit for autocommit, _ in seen)


def test_a_listing_page_runs_outside_a_transaction(cold: TestClient, keys: Keys, pg_store: Store,
                                                   writers: list[ExecutionWriter]) -> None:
    _get(cold, keys, "/v1/executions?limit=2")
    with statements(pg_store) as seen:
        _get(cold, keys, "/v1/executions?limit=2")
        _get(cold, keys, f"/v1/executions/{writers[0].execution_id}/calls?limit=3")
    assert seen
    assert all(autocommit for autocommit, _ in seen)


def test_a_tree_still_reads_one_snapshot(cold: TestClient, keys: Keys, pg_store: Store,
                                         writers: list[ExecutionWriter]) -> None:
    """Its statements (execution, nodes, segments, scores) must agree: one REPEATABLE READ transaction."""
    url = f"/v1/executions/{writers[0].execution_id}/tree"
    _get(cold, keys, url)
    with statements(pg_store) as seen:
        _get(cold, keys, url)
    assert len(seen) >= 3
    assert set(seen) == {(False, "REPEATABLE_READ")}


def test_the_first_request_builds_no_route_state(pg_store: Store, keys: Keys, writers: list[ExecutionWriter],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """FastAPI builds an included route's dependency tree and fields when a request is first matched
    against it; ``create_app`` does it for every route, so a worker's first request does not."""
    app = create_app(ApiSettings(api_cache_bytes=0), store=pg_store)
    built: list[object] = []
    real = fastapi.routing._EffectiveRouteContext.from_api_route

    def counting(**kwargs: Any) -> Any:
        built.append(kwargs["original_route"])
        return real(**kwargs)

    monkeypatch.setattr(fastapi.routing._EffectiveRouteContext, "from_api_route", counting)
    with TestClient(app, raise_server_exceptions=False) as client:
        _get(client, keys, f"/v1/calls/{calls_of(writers[0])[0].event_id}/audit")
        _get(client, keys, "/v1/executions?limit=1")
    assert built == []


@pytest.mark.parametrize("cache_bytes", [0, 1 << 20])
def test_the_version_is_read_only_when_a_cache_keys_by_it(pg_store: Store, keys: Keys, writers: list[ExecutionWriter],
                                                          cache_bytes: int) -> None:
    """With the response cache off a tree needs no version (a round trip); each answer is built afresh,
    so a tree read after a score revision shows it."""
    eid = writers[0].execution_id
    app = create_app(ApiSettings(api_cache_bytes=cache_bytes), store=pg_store)
    with TestClient(app, raise_server_exceptions=False) as client:
        versions = app.state.sapwood.versions
        asked: list[str] = []
        real = versions.version

        async def counting(execution_id: str) -> int:
            asked.append(execution_id)
            return int(await real(execution_id))

        versions.version = counting
        for suffix in ("tree", "tree/summary", "trajectories"):
            _get(client, keys, f"/v1/executions/{eid}/{suffix}")
        assert asked == ([] if cache_bytes == 0 else [eid] * 3)
        r = client.post(f"/v1/executions/{eid}/scores", headers=keys.headers("write"), json={"score": 0.5})
        assert r.status_code == 201, r.text
        tree = client.get(f"/v1/executions/{eid}/tree", headers=keys.headers("read")).json()
        assert tree["scores"][-1]["score"] == 0.5
