"""Security and limits: the authorization matrix over every route, hashed keys, body limit, CORS, errors."""

from __future__ import annotations

import hashlib
import uuid
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.routing import APIRoute

from sapwood.api import auth
from sapwood.api.deps import RequireScope
from sapwood.platform import schema as t
from sapwood.platform.errors import StoreError
from sapwood.platform.store import Store
from tests.support.api_client import Keys, TestClient, make_client

#: Routes that answer without a key. Everything else must refuse requests without the right scope.
PUBLIC = {"/healthz", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/ui", "/ui/features.json"}
BODIES: dict[str, dict[str, Any]] = {
    "/v1/runs": {"run_id": "matrix-run"},
    "/v1/executions/{execution_id}/scores": {"score": 0.5},
    "/v1/keys": {"name": "matrix", "scopes": ["read"]},
}
SCOPES = ("read", "write", "admin")


def required_scope(route: APIRoute) -> str | None:
    """The scope named by the route's RequireScope dependency (searched through nested dependencies)."""
    stack = list(route.dependant.dependencies)
    while stack:
        dep = stack.pop()
        if isinstance(dep.call, RequireScope):
            return dep.call.scope
        stack.extend(dep.dependencies)
    return None


def concrete_path(route: APIRoute) -> str:
    path = route.path
    for param in route.dependant.path_params:
        value = {"key_id": "0123456789abcdef", "run_id": "rollout-a"}.get(param.name, str(uuid.uuid4()))
        path = path.replace("{" + param.name + "}", value)
    return path


def flat_routes(routes: Any, prefix: str = "") -> Any:
    """(path prefix, route) of every route, also inside routers that newer FastAPI includes lazily."""
    for route in routes:
        inner = getattr(route, "original_router", None)
        if inner is not None:
            yield from flat_routes(inner.routes, prefix + getattr(route.include_context, "prefix", ""))
        else:
            yield prefix, route


def routes(client: TestClient) -> list[tuple[str, str, APIRoute]]:
    out = []
    for prefix, route in flat_routes(client.app.routes):  # type: ignore[attr-defined]
        if not isinstance(route, APIRoute):
            assert route.path in PUBLIC, f"non-API route {route.path} is not in the public allow-list"
            continue
        assert not prefix, "routers are included without an extra prefix"
        for method in sorted(route.methods):
            out.append((method, route.path, route))
    return out


def key_with(store: Store, scopes: list[str]) -> str:
    with store.transaction() as conn:
        return auth.create_key(conn, "matrix", scopes)[0]


def test_authorization_matrix(client: TestClient, pg_store: Store, keys: Keys) -> None:
    revoked = key_with(pg_store, list(SCOPES))
    with pg_store.transaction() as conn:
        auth.revoke_key(conn, revoked.split(".")[0])
    good_id = keys.all.split(".")[0]
    bad_keys = {
        "garbage": "garbage",
        "wrong secret": f"{good_id}.{'A' * 43}",
        "unknown id": f"{'f' * 16}.{keys.all.split('.')[1]}",
        "revoked": revoked,
        "empty secret": f"{good_id}.",
    }
    failures: list[str] = []
    n_routes = 0
    for method, template, route in routes(client):
        path = concrete_path(route)
        body = BODIES.get(template) if method in ("POST", "PUT", "PATCH") else None
        scope = required_scope(route)
        if template in PUBLIC:
            continue
        n_routes += 1
        if scope is None:
            failures.append(f"{method} {template}: no RequireScope dependency")
            continue

        def call(headers: dict[str, str], path: str = path, method: str = method,
                 body: dict[str, Any] | None = body) -> Any:
            return client.request(method, path, headers=headers, json=body)

        r = call({})
        if r.status_code != 401 or r.json()["error"]["code"] != "unauthorized":
            failures.append(f"{method} {template} without key: {r.status_code}")
        for label, bad in bad_keys.items():
            for headers in ({"Authorization": f"Bearer {bad}"}, {"X-API-Key": bad}):
                r = call(headers)
                if r.status_code != 401:
                    failures.append(f"{method} {template} with {label} key {list(headers)}: {r.status_code}")
        r = call({"Authorization": "Basic dXNlcjpwYXNz"})
        if r.status_code != 401:
            failures.append(f"{method} {template} with Basic auth: {r.status_code}")
        others = [s for s in SCOPES if s != scope]
        r = call({"X-API-Key": key_with(pg_store, others)})
        if r.status_code != 403 or r.json()["error"]["code"] != "forbidden":
            failures.append(f"{method} {template} with scopes {others}: {r.status_code}")
        r = call({"X-API-Key": key_with(pg_store, [scope])})
        if r.status_code in (401, 403) or r.status_code >= 500:
            failures.append(f"{method} {template} with scope {scope}: {r.status_code} {r.text[:200]}")
    assert failures == []
    assert n_routes >= 19


def test_the_expected_routes_need_write_and_admin(client: TestClient) -> None:
    scopes = {(m, p): required_scope(r) for m, p, r in routes(client) if p not in PUBLIC}
    assert scopes[("POST", "/v1/runs")] == "write"
    assert scopes[("POST", "/v1/executions/{execution_id}/scores")] == "write"
    assert {s for (m, p), s in scopes.items() if p.startswith("/v1/keys")} == {"admin"}
    assert {s for (m, p), s in scopes.items() if m == "GET" and not p.startswith("/v1/keys")} == {"read"}


def test_keys_are_stored_as_sha256_and_compared_in_constant_time(client: TestClient, pg_store: Store, keys: Keys,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    r = client.post("/v1/keys", headers=keys.headers("admin"), json={"name": "ci", "scopes": ["read", "read"]})
    assert r.status_code == 201, r.text
    created = r.json()
    key_id, secret = created["key"].split(".")
    assert key_id == created["key_id"]
    assert created["scopes"] == ["read"]
    with pg_store.transaction() as conn:
        row = conn.execute(sa.select(t.api_keys).where(t.api_keys.c.key_id == key_id)).mappings().one()
    assert bytes(row["secret_hash"]) == hashlib.sha256(secret.encode()).digest()
    assert secret not in str(dict(row))
    listed = client.get("/v1/keys", headers=keys.headers("admin")).json()["items"]
    assert "key" not in listed[0]
    assert "secret_hash" not in listed[0]
    calls: list[tuple[bytes, bytes]] = []
    real = auth.hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", spy)
    assert client.get("/v1/stats", headers={"X-API-Key": created["key"]}).status_code == 200
    assert client.get("/v1/stats", headers={"X-API-Key": f"{'e' * 16}.{secret}"}).status_code == 401
    assert len(calls) == 2  # a hash comparison even for an unknown key id


def test_revocation(client: TestClient, pg_store: Store, keys: Keys) -> None:
    key = key_with(pg_store, ["read"])
    key_id = key.split(".")[0]
    assert client.get("/v1/runs", headers={"X-API-Key": key}).status_code == 200
    r = client.delete(f"/v1/keys/{key_id}", headers=keys.headers("admin"))
    assert r.status_code == 200
    assert r.json()["revoked"] is True
    assert client.get("/v1/runs", headers={"X-API-Key": key}).status_code == 401
    assert client.delete("/v1/keys/0123456789abcdef", headers=keys.headers("admin")).status_code == 404
    # revoked elsewhere (another worker, the CLI): seen once the key cache entry expires
    other = key_with(pg_store, ["read"])
    with make_client(pg_store, api_key_cache_s=0) as c:
        assert c.get("/v1/runs", headers={"X-API-Key": other}).status_code == 200
        with pg_store.transaction() as conn:
            auth.revoke_key(conn, other.split(".")[0])
        assert c.get("/v1/runs", headers={"X-API-Key": other}).status_code == 401


def test_request_body_limit(pg_store: Store, keys: Keys) -> None:
    with make_client(pg_store, api_max_body_bytes=1000) as c:
        big = {"run_id": "x", "description": "d" * 1500}
        r = c.post("/v1/runs", headers=keys.headers("write"), json=big)
        assert r.status_code == 413
        assert r.json()["error"]["code"] == "payload_too_large"

        def chunks() -> Any:  # no Content-Length: the limit applies while reading
            for _ in range(5):
                yield b'{"description": "' + b"x" * 400

        r = c.post("/v1/runs", headers={**keys.headers("write"), "Content-Type": "application/json"},
                   content=chunks())
        assert r.status_code == 413
        assert r.json()["error"]["code"] == "payload_too_large"
        r = c.post("/v1/runs", headers=keys.headers("write"), json={"run_id": "small"})
        assert r.status_code == 201


def test_cors_is_closed_by_default_and_follows_the_allow_list(pg_store: Store, keys: Keys) -> None:
    headers = {**keys.headers("read"), "Origin": "https://evil.example"}
    with make_client(pg_store) as c:
        r = c.get("/v1/runs", headers=headers)
        assert r.status_code == 200
        assert "access-control-allow-origin" not in r.headers
        pre = c.options("/v1/runs", headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "GET"})
        assert "access-control-allow-origin" not in pre.headers
    with make_client(pg_store, api_cors_origins="https://ui.example, https://other.example") as c:
        ok = c.get("/v1/runs", headers={**keys.headers("read"), "Origin": "https://ui.example"})
        assert ok.headers["access-control-allow-origin"] == "https://ui.example"
        big = c.post("/v1/runs", headers={**keys.headers("write"), "Origin": "https://ui.example"},
                     json={"description": "x" * (2 << 20)})
        assert big.status_code == 413
        assert big.headers["access-control-allow-origin"] == "https://ui.example"
        assert "access-control-allow-origin" not in c.get("/v1/runs", headers=headers).headers


def test_errors_are_json_without_internals(client: TestClient, pg_store: Store, keys: Keys,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    r = client.get("/v1/nope", headers=keys.headers("read"))
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "not_found"
    r = client.put("/v1/runs", headers=keys.headers("read"))
    assert r.status_code == 405
    assert r.json()["error"]["code"] == "method_not_allowed"
    r = client.post("/v1/runs", headers={**keys.headers("write"), "Content-Type": "application/json"},
                    content=b"{not json")
    assert r.status_code == 422
    assert r.json()["error"]["code"] == "invalid_request"

    from sapwood.api.queries import executions as q

    def boom(*_a: Any, **_k: Any) -> Any:
        raise RuntimeError("secret internal detail")

    monkeypatch.setattr(q, "list_runs", boom)
    r = client.get("/v1/runs", headers=keys.headers("read"))
    assert r.status_code == 500
    assert r.json() == {"error": {"code": "internal", "message":
                                  "internal error; the server log has the details"}}
    assert "secret" not in r.text
    assert "Traceback" not in r.text

    def store_error(*_a: Any, **_k: Any) -> Any:
        raise StoreError("database error: relation secret_table does not exist")

    monkeypatch.setattr(q, "list_runs", store_error)
    r = client.get("/v1/runs", headers=keys.headers("read"))
    assert r.status_code == 500
    assert "secret_table" not in r.text


def test_statement_timeout_is_a_503(pg_url: str, keys: Keys, monkeypatch: pytest.MonkeyPatch) -> None:
    from sapwood.api.routes import stats as stats_route

    slow_store = Store.open(pg_url, statement_timeout_ms=100)

    def slow(store: Store) -> Any:
        with store.engine.connect() as conn:
            conn.execute(sa.text("SELECT pg_sleep(2)"))

    monkeypatch.setattr(stats_route, "store_stats", slow)
    with make_client(slow_store) as c:
        r = c.get("/v1/stats", headers=keys.headers("read"))
    slow_store.close()
    assert r.status_code == 503
    assert r.headers["retry-after"] == "1"
    assert r.json()["error"]["code"] == "store_unavailable"
    assert "statement timeout" in r.json()["error"]["message"]


def test_health_is_public(client: TestClient) -> None:
    r = client.get("/healthz")
    assert r.status_code == 200
    assert r.json() == {"status": "ok", "database": "postgresql"}
