"""Hostile input: what a `write` key or a forged request could do to the store or to other users.

Each test reproduces one finding of an attack on the API (deep or invalid run configs, forged
cursors, lost id races, concurrent score revisions on SQLite, run ids with ``/``, revoking the last
admin key, OpenAPI limits, ``Allow``, header sizes, redirects built from ``Host``) on the backend(s)
where it happened, and checks that the answer is a clean 4xx and that reads keep working.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from sapwood.api import ApiSettings, auth, create_app
from sapwood.api.cursors import MAC_BYTES
from sapwood.platform import schema as t
from sapwood.platform.store import Store
from tests.support.api_client import Keys, TestClient, load_executions, make_client, make_keys
from tests.support.live_server import sapwood_serve, serve_in_thread


def deep(levels: int) -> Any:
    """A JSON object ``levels`` objects deep."""
    value: Any = 1
    for _ in range(levels):
        value = {"a": value}
    return value


def post_raw(client: TestClient, keys: Keys, url: str, raw: str) -> Any:
    return client.post(url, headers={**keys.headers("write"), "Content-Type": "application/json"},
                       content=raw.encode())


@pytest.mark.parametrize("config", [
    pytest.param(deep(300), id="300 levels"),
    pytest.param(deep(33), id="33 levels"),
    pytest.param({"k": "x" * 70_000}, id="70 KB"),
    pytest.param({"big": 2**70 + 1}, id="int above 64 bits that no double holds"),
])
def test_a_run_config_the_store_could_not_read_back_is_refused(any_store: Store, config: Any) -> None:
    keys = make_keys(any_store)
    with make_client(any_store) as c:
        r = c.post("/v1/runs", headers=keys.headers("write"), json={"run_id": "deep", "config": config})
        assert r.status_code == 422, r.text
        assert "config" in r.json()["error"]["message"]
        ok = c.post("/v1/runs", headers=keys.headers("write"), json={"run_id": "fine", "config": deep(32)})
        assert ok.status_code == 201, ok.text
        listed = c.get("/v1/runs", headers=keys.headers("read"))
        assert listed.status_code == 200
        assert [i["run_id"] for i in listed.json()["items"]] == ["fine"]
        assert c.get("/v1/runs/fine", headers=keys.headers("read")).json()["config"] == deep(32)
    with any_store.engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(t.runs)).scalar_one() == 1


@pytest.mark.parametrize("raw", [
    '{"run_id": "s1", "config": {"k": "a\\ud800b"}}',  # lone high surrogate in a value
    '{"run_id": "s2", "config": {"\\udfff": 1}}',  # lone low surrogate in a key
    '{"run_id": "s3", "config": {"k": ["\\u0000"]}}',
    '{"run_id": "s4", "description": "\\ud800"}',
    '{"run_id": "s5", "config": {"k": 1e999}}',
])
def test_lone_surrogates_nul_and_infinity_are_refused_before_the_commit(any_store: Store, raw: str) -> None:
    keys = make_keys(any_store)
    with make_client(any_store) as c:
        r = post_raw(c, keys, "/v1/runs", raw)
        assert r.status_code == 422, r.text
        assert c.get("/v1/runs", headers=keys.headers("read")).status_code == 200
    with any_store.engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(t.runs)).scalar_one() == 0


def test_deeply_nested_json_bodies_get_400_not_500(any_store: Store) -> None:
    keys = make_keys(any_store)
    with make_client(any_store) as c:
        r = post_raw(c, keys, "/v1/runs", '{"config": ' + "[" * 100_000 + "]" * 100_000 + "}")
        assert r.status_code in (400, 422), r.text


@pytest.mark.parametrize("run_id", ["a/b", "x/items", "../x", "-x", "a b", "a?b", "é", "x" * 129])
def test_run_ids_are_limited_to_the_safe_alphabet(any_store: Store, run_id: str) -> None:
    keys = make_keys(any_store)
    with make_client(any_store) as c:
        r = c.post("/v1/runs", headers=keys.headers("write"), json={"run_id": run_id})
        assert r.status_code == 422, r.text
        ok = c.post("/v1/runs", headers=keys.headers("write"), json={"run_id": "Aa0._:@-z"})
        assert ok.status_code == 201
        assert c.get("/v1/runs/Aa0._:@-z/items", headers=keys.headers("read")).status_code == 200


# -- cursors -----------------------------------------------------------------------------------------------
def forge(cursor: str, payload: list[Any]) -> str:
    """``cursor``'s MAC on another payload (what an attacker without the secret can do)."""
    raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
    return base64.urlsafe_b64encode(raw[:MAC_BYTES] + json.dumps(payload).encode()).decode().rstrip("=")


def test_forged_cursors_get_422_and_are_bound_to_their_resource(pg_store: Store, keys: Keys,
                                                                client: TestClient) -> None:
    writers = load_executions(pg_store, 2)
    a, b = (w.execution_id for w in writers)
    h = keys.headers("read")
    page = client.get(f"/v1/executions/{a}/calls", headers=h, params={"limit": 2}).json()
    cursor = page["next_cursor"]
    assert client.get(f"/v1/executions/{a}/calls", headers=h, params={"cursor": cursor}).status_code == 200
    # a calls cursor of execution a on execution b
    r = client.get(f"/v1/executions/{b}/calls", headers=h, params={"cursor": cursor})
    assert r.status_code == 422
    assert "cursor" in r.json()["error"]["message"]
    for payload in ([f"calls:{a}", 2**64], [f"calls:{a}", -(2**80)], [f"calls:{a}", 10**400 // 10**399]):
        r = client.get(f"/v1/executions/{a}/calls", headers=h, params={"cursor": forge(cursor, payload)})
        assert r.status_code == 422, r.text
    # an unsigned cursor in the old format with an integer beyond int64
    old = base64.urlsafe_b64encode(json.dumps(["calls", 2**64]).encode()).decode().rstrip("=")
    assert client.get(f"/v1/executions/{a}/calls", headers=h, params={"cursor": old}).status_code == 422
    # the items cursor's position cannot be edited
    with pg_store.transaction() as conn:
        from sapwood.platform import runs

        runs.create_run(conn, "r1", runs.ExecutionFilter())
        runs.create_run(conn, "r2", runs.ExecutionFilter())
    items = client.get("/v1/runs/r1/items", headers=h, params={"limit": 1}).json()
    c1 = items["next_cursor"]
    raw = json.loads(base64.urlsafe_b64decode(c1 + "=" * (-len(c1) % 4))[MAC_BYTES:])
    assert raw[0] == "items:r1"
    assert raw[-1] == 1
    assert client.get("/v1/runs/r1/items", headers=h, params={"cursor": forge(c1, [*raw[:-1], 10**6])}
                      ).status_code == 422
    assert client.get("/v1/runs/r2/items", headers=h, params={"cursor": c1}).status_code == 422
    nxt = client.get("/v1/runs/r1/items", headers=h, params={"cursor": c1}).json()
    assert [i["position"] for i in nxt["items"]] == [1]
    # the connection survives (no reset): one more request on the same client
    assert client.get("/v1/runs", headers=h).status_code == 200


def test_cursors_of_one_server_work_on_its_other_workers_only_with_the_same_secret(pg_store: Store,
                                                                                   keys: Keys) -> None:
    load_executions(pg_store, 3)
    h = keys.headers("read")
    with make_client(pg_store, api_cursor_secret="shared") as one, \
            make_client(pg_store, api_cursor_secret="shared") as two, \
            make_client(pg_store, api_cursor_secret="other") as other:
        cursor = one.get("/v1/executions", headers=h, params={"limit": 1}).json()["next_cursor"]
        assert two.get("/v1/executions", headers=h, params={"cursor": cursor}).status_code == 200
        assert other.get("/v1/executions", headers=h, params={"cursor": cursor}).status_code == 422


# -- races -------------------------------------------------------------------------------------------------
def test_a_lost_run_id_race_is_a_clean_409(pg_store: Store, keys: Keys, client: TestClient) -> None:
    """Another transaction inserts the id after the API checked it is free: the insert waits on the
    unique index, then fails; the answer names the run, not the constraint or the key values."""
    holder = pg_store.engine.connect()
    tx = holder.begin()
    holder.execute(t.runs.insert().values(run_id="raced", kind="replay", filter={}, seed=0, config={},
                                          description="", created_at=time.time()))
    result: dict[str, Any] = {}

    def post() -> None:
        result["r"] = client.post("/v1/runs", headers=keys.headers("write"), json={"run_id": "raced"})

    thread = threading.Thread(target=post)
    thread.start()
    time.sleep(1.0)  # the API's existence check has run and its insert waits on the uncommitted row
    tx.commit()
    holder.close()
    thread.join(30)
    r = result["r"]
    assert r.status_code == 409, r.text
    message = r.json()["error"]["message"]
    assert message == "run 'raced' already exists"
    assert "pkey" not in r.text
    assert "Key (" not in r.text
    assert "constraint" not in r.text


def test_driver_conflicts_never_show_driver_text(client: TestClient, keys: Keys,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from sapwood.api.queries import executions as q

    def collide(*_a: Any, **_k: Any) -> Any:
        raise sa.exc.IntegrityError("INSERT INTO runs", {}, Exception(
            'duplicate key value violates unique constraint "runs_pkey" DETAIL: Key (run_id)=(x) already exists'))

    monkeypatch.setattr(q, "list_runs", collide)
    r = client.get("/v1/runs", headers=keys.headers("read"))
    assert r.status_code == 409
    assert "runs_pkey" not in r.text
    assert "Key (" not in r.text


def test_concurrent_score_revisions_both_succeed_on_sqlite(tmp_path: Path) -> None:
    """Real concurrent requests (uvicorn, one thread per client): every revision is taken, none lost."""
    store = Store.open(f"sqlite:///{tmp_path / 'scores.db'}")
    writers = load_executions(store, 1)
    keys = make_keys(store)
    eid = writers[0].execution_id
    n = 8
    with serve_in_thread(create_app(ApiSettings(), store=store)) as base:
        before = httpx.get(f"{base}/v1/executions/{eid}/scores", headers=keys.headers("read")).json()
        barrier = threading.Barrier(n)

        def post(i: int) -> httpx.Response:
            with httpx.Client(base_url=base, headers=keys.headers("write"), timeout=60) as http:
                http.get("/healthz")  # connected before the barrier
                barrier.wait()
                return http.post(f"/v1/executions/{eid}/scores", json={"score": i / 10})

        with ThreadPoolExecutor(n) as pool:
            answers = list(pool.map(post, range(n)))
        assert [r.status_code for r in answers] == [201] * n, [r.text for r in answers]
        revisions = sorted(r.json()["revision"] for r in answers)
        assert revisions == list(range(len(before), len(before) + n))
        after = httpx.get(f"{base}/v1/executions/{eid}/scores", headers=keys.headers("read")).json()
        assert len(after) == len(before) + n
    store.close()


# -- keys --------------------------------------------------------------------------------------------------
def test_the_last_admin_key_cannot_be_revoked(any_store: Store) -> None:
    with any_store.transaction() as conn:
        first = auth.create_key(conn, "first admin", "admin")[0]
        reader = auth.create_key(conn, "reader", "read")[0]
    h = {"X-API-Key": first}
    first_id = first.split(".")[0]
    with make_client(any_store) as c:
        r = c.delete(f"/v1/keys/{first_id}", headers=h)
        assert r.status_code == 409
        assert "last active admin key" in r.json()["error"]["message"]
        assert c.delete(f"/v1/keys/{reader.split('.')[0]}", headers=h).status_code == 200
        second = c.post("/v1/keys", headers=h, json={"name": "second", "scopes": ["admin", "read"]}).json()
        assert c.delete(f"/v1/keys/{first_id}", headers=h).status_code == 200
        h2 = {"X-API-Key": second["key"]}
        assert c.delete(f"/v1/keys/{second['key_id']}", headers=h2).status_code == 409
        assert c.get("/v1/keys", headers=h2).status_code == 200


# -- the HTTP surface --------------------------------------------------------------------------------------
def test_openapi_limits_are_the_limits_the_server_enforces(pg_store: Store, keys: Keys) -> None:
    writers = load_executions(pg_store, 1)
    w = writers[0]
    settings = {"api_max_page_size": 40, "api_tree_max_nodes": 300, "api_max_token_page": 500,
                "api_max_export_executions": 7}
    with make_client(pg_store, **settings) as c:
        spec = c.get("/openapi.json").json()

        def maximum(path: str, name: str) -> int:
            (param,) = [p for p in spec["paths"][path]["get"]["parameters"] if p["name"] == name]
            options = param["schema"].get("anyOf", [param["schema"]])
            (value,) = [o["maximum"] for o in options if o.get("type") == "integer"]
            return int(value)

        leaf = w.leaves()[0]
        cases = [("/v1/executions", "/v1/executions", "limit", 40),
                 ("/v1/runs", "/v1/runs", "limit", 40),
                 ("/v1/executions/{execution_id}/tree", f"/v1/executions/{w.execution_id}/tree", "max_nodes", 300),
                 ("/v1/nodes/{node_id}", f"/v1/nodes/{leaf}", "limit", 500),
                 ("/v1/nodes/{node_id}/trajectory", f"/v1/nodes/{leaf}/trajectory", "limit", 500),
                 ("/v1/nodes/{node_id}/calls", f"/v1/nodes/{leaf}/calls", "limit", 40),
                 ("/v1/export.parquet", "/v1/export.parquet", "limit", 7)]
        for template, url, name, limit in cases:
            assert maximum(template, name) == limit, template
            assert c.get(url, headers=keys.headers("read"), params={name: limit}).status_code == 200, url
            assert c.get(url, headers=keys.headers("read"), params={name: limit + 1}).status_code == 422, url


def test_allow_lists_every_method_of_the_path(client: TestClient, keys: Keys) -> None:
    for method in ("OPTIONS", "PUT", "PATCH"):
        r = client.request(method, "/v1/runs", headers=keys.headers("read"))
        assert r.status_code == 405
        assert r.headers["allow"] == "GET, POST"
    r = client.request("PUT", "/v1/keys/0123456789abcdef", headers=keys.headers("admin"))
    assert r.status_code == 405
    assert r.headers["allow"] == "DELETE"


def test_invalid_utf8_gets_a_documented_400(client: TestClient, keys: Keys) -> None:
    r = client.post("/v1/runs", headers={**keys.headers("write"), "Content-Type": "application/json"},
                    content=b'{"run_id": "\xff\xfe"}')
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "bad_request"
    spec = client.get("/openapi.json").json()
    assert "400" in spec["paths"]["/v1/runs"]["post"]["responses"]


def test_request_headers_are_size_limited(pg_store: Store, keys: Keys) -> None:
    with make_client(pg_store, api_max_header_bytes=4096) as c:
        assert c.get("/v1/runs", headers={**keys.headers("read"), "X-Pad": "a" * 3000}).status_code == 200
        r = c.get("/v1/runs", headers={**keys.headers("read"), "X-Pad": "a" * 5000})
        assert r.status_code == 431
        assert r.json()["error"]["code"] == "headers_too_large"
        r = c.get("/healthz", headers={"X-Pad": "a" * (8 << 20)})
        assert r.status_code == 431


def test_redirects_do_not_trust_the_host_header(client: TestClient, keys: Keys) -> None:
    for path, target in (("/v1/runs/", "/v1/runs"), ("/ui", "/ui/"), ("/v1/executions/?limit=2",
                                                                       "/v1/executions?limit=2")):
        r = client.get(path, headers={**keys.headers("read"), "Host": "evil.example"}, follow_redirects=False)
        assert r.status_code in (307, 308), (path, r.status_code)
        assert r.headers["location"] == target, (path, r.headers["location"])
    r = client.get("//evil.example/", headers=keys.headers("read"), follow_redirects=False)
    assert not r.headers.get("location", "").startswith("//")


def test_sapwood_serve_workers_share_one_cursor_secret(tmp_path: Path) -> None:
    """Two uvicorn workers: pages fetched over fresh connections (either worker) accept each other's cursors."""
    url = f"sqlite:///{tmp_path / 'workers.db'}"
    store = Store.open(url)
    load_executions(store, 6)
    keys = make_keys(store)
    store.close()
    env = {"SAPWOOD_DATABASE_URL": url, "SAPWOOD_KAFKA_BOOTSTRAP": "", "SAPWOOD_API_CURSOR_SECRET": ""}
    with sapwood_serve(env, "--workers", "2", "--log-level", "warning") as base:
        seen, cursor = [], None
        for _ in range(6):
            params = {"limit": 1, **({"cursor": cursor} if cursor else {})}
            r = httpx.get(base + "/v1/executions", params=params, headers={**keys.headers("read"),
                                                                           "Connection": "close"})
            assert r.status_code == 200, r.text
            seen += [i["execution_id"] for i in r.json()["items"]]
            cursor = r.json()["next_cursor"]
        assert len(set(seen)) == 6
        assert cursor is None
