"""Limits before work: the API key before the body (401), error bodies of bounded size."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import pytest

from sapwood.api import ApiSettings, create_app
from sapwood.api.errors import MAX_ERROR_DETAILS
from sapwood.platform.storage.engines import make_engine
from sapwood.platform.store import Store
from tests.support.api_client import make_client, make_keys
from tests.support.live_server import serve_in_thread


@pytest.fixture
def sqlite_store(tmp_path: object) -> Iterator[Store]:
    store = Store.open(f"sqlite:///{tmp_path}/limits.db")
    yield store
    store.close()


@pytest.mark.parametrize("headers", [
    pytest.param({}, id="no key"),
    pytest.param({"X-API-Key": "not-a-key"}, id="malformed key"),
    pytest.param({"Authorization": "Bearer 0123456789abcdef.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"},
                 id="unknown key"),
])
@pytest.mark.parametrize("body", [b"{not json", b'{"kind": 5, "config": []}'])
def test_an_unauthenticated_body_gets_401_not_422(sqlite_store: Store, headers: dict[str, str],
                                                  body: bytes) -> None:
    with make_client(sqlite_store) as client:
        response = client.post("/v1/runs", headers={**headers, "Content-Type": "application/json"}, content=body)
    assert response.status_code == 401, response.text
    assert response.headers["www-authenticate"] == "Bearer"
    assert response.json()["error"]["code"] == "unauthorized"


def test_a_valid_key_still_gets_the_body_checked(sqlite_store: Store) -> None:
    keys = make_keys(sqlite_store)
    with make_client(sqlite_store) as client:
        response = client.post("/v1/runs", headers={**keys.headers("write"), "Content-Type": "application/json"},
                               content=b"{not json")
        assert response.status_code in (400, 422), response.text
        forbidden = client.post("/v1/runs", headers=keys.headers("read"), json={})
        assert forbidden.status_code == 403, forbidden.text


def test_the_401_comes_before_the_body_is_read(sqlite_store: Store) -> None:
    """Headers announcing a body that never comes: the server answers 401 without waiting for it."""
    app = create_app(ApiSettings(), store=sqlite_store)
    with serve_in_thread(app) as base:
        host, port = base.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(b"POST /v1/runs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 100000\r\n\r\n{")
            answer = sock.recv(65536)  # times out (fails) if the server waits for the other 99,999 bytes
    assert answer.startswith(b"HTTP/1.1 401"), answer[:200]


def test_a_body_with_sixty_thousand_problems_gets_a_small_422(sqlite_store: Store) -> None:
    keys = make_keys(sqlite_store)
    body = json.dumps({"filter": {"status": ["nope"] * 60_000}}).encode()
    assert len(body) < 512 * 1024  # within the route's body limit
    with make_client(sqlite_store) as client:
        response = client.post("/v1/runs", headers={**keys.headers("write"), "Content-Type": "application/json"},
                               content=body)
    assert response.status_code == 422, response.text[:300]
    assert len(response.content) < 16_384, len(response.content)
    error = response.json()["error"]
    assert len(error["details"]) == MAX_ERROR_DETAILS
    assert "more problems" in error["message"]


def test_a_deeply_nested_problem_gets_a_bounded_location(sqlite_store: Store) -> None:
    keys = make_keys(sqlite_store)
    config: object = "x"
    for _ in range(200):
        config = [config]
    with make_client(sqlite_store) as client:
        response = client.post("/v1/runs", headers=keys.headers("write"),
                               json={"filter": {"status": config}})
    assert response.status_code in (400, 422), response.text[:300]
    assert len(response.content) < 16_384, len(response.content)




@pytest.mark.parametrize(("path", "limit"), [("/v1/runs", 512 * 1024), ("/v1/keys", 16 * 1024),
                                             ("/v1/executions/00000000-0000-0000-0000-000000000000/scores",
                                              256 * 1024)])
def test_each_route_has_its_own_body_limit(sqlite_store: Store, path: str, limit: int) -> None:
    keys = make_keys(sqlite_store)
    with make_client(sqlite_store) as client:
        over = client.post(path, headers={**keys.headers("all"), "Content-Type": "application/json"},
                           content=b'{"note": "' + b"x" * limit + b'"}')
        assert over.status_code == 413, over.text[:300]
        assert str(limit) in over.json()["error"]["message"]
        under = client.post(path, headers={**keys.headers("all"), "Content-Type": "application/json"},
                            content=b'{"note": "' + b"x" * (limit - 100) + b'"}')
        assert under.status_code != 413, under.text[:300]


def test_an_exhausted_pool_answers_503_not_500(pg_url: str) -> None:
    store = Store(make_engine(pg_url, pool_size=1, max_overflow=0, pool_timeout=0.2))
    store.migrate()
    keys = make_keys(store)
    try:
        with make_client(store, api_key_cache_s=60) as client:
            assert client.get("/v1/runs", headers=keys.headers("read")).status_code == 200  # the key is cached now
            with store.engine.connect():  # the pool's only connection, held
                response = client.get("/v1/runs", headers=keys.headers("read"))
            assert response.status_code == 503, response.text
            assert response.headers["retry-after"] == "1"
            assert "busy" in response.json()["error"]["message"]
            assert client.get("/v1/runs", headers=keys.headers("read")).status_code == 200
    finally:
        store.close()
