"""``Idempotency-Key`` on every POST, on PostgreSQL and SQLite: a retry replays the stored answer
without doing the work again, another body under the same key is refused, keys are bounded, and
two concurrent first requests under one key do the work once."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import sqlalchemy as sa
from pydantic import BaseModel
from sqlalchemy.engine import Connection
from starlette.requests import Request

from sapwood.api import create_app
from sapwood.api.auth import Principal
from sapwood.api.config import ApiSettings
from sapwood.api.idempotency import Answer, idempotent, json_bytes
from sapwood.api.schemas import RunCreate, RunCreated
from sapwood.api.writes import create_run
from sapwood.platform import schema as t
from sapwood.platform.store import Store
from tests.support.api_client import TestClient, load_executions, make_client, make_keys

POSTS = ["/v1/runs", "/v1/keys", "/v1/executions/{eid}/scores"]


def n_runs(store: Store) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(t.runs)).scalar_one())


def n_rows(store: Store, table: sa.Table) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(table)).scalar_one())


def bodies(eid: str) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """Per POST route: a body, and another body for the same route."""
    return {"/v1/runs": ({"kind": "replay", "seed": 1}, {"kind": "replay", "seed": 2}),
            "/v1/keys": ({"name": "k", "scopes": ["read"]}, {"name": "k2", "scopes": ["read"]}),
            f"/v1/executions/{eid}/scores": ({"score": 0.5}, {"score": 0.25})}


@pytest.fixture
def setup(any_store: Store) -> tuple[TestClient, dict[str, str], str]:
    eid = load_executions(any_store, 1)[0].execution_id
    keys = make_keys(any_store)
    return make_client(any_store), keys.headers("all"), eid


def test_a_retried_run_creation_without_run_id_creates_one_run(any_store: Store, setup: Any) -> None:
    c, headers, _ = setup
    h = {**headers, "Idempotency-Key": "create-run-1"}
    first = c.post("/v1/runs", json={"kind": "replay"}, headers=h)
    again = c.post("/v1/runs", json={"kind": "replay"}, headers=h)
    assert first.status_code == 201, first.text
    assert again.status_code == 201
    assert again.content == first.content
    assert again.headers["idempotent-replayed"] == "true"
    assert "idempotent-replayed" not in first.headers
    assert n_runs(any_store) == 1
    assert c.get("/v1/runs", headers=headers).json()["items"][0]["run_id"] == first.json()["run_id"]
    # without the header every POST is new work
    for _ in range(2):
        assert c.post("/v1/runs", json={"kind": "replay"}, headers=headers).status_code == 201
    assert n_runs(any_store) == 3


def test_a_retried_score_adds_one_revision(setup: Any) -> None:
    c, headers, eid = setup
    h = {**headers, "Idempotency-Key": "score-1"}
    answers = [c.post(f"/v1/executions/{eid}/scores", json={"score": 0.5, "note": "x"}, headers=h) for _ in range(3)]
    assert [a.status_code for a in answers] == [201, 201, 201]
    assert {a.content for a in answers} == {answers[0].content}
    revisions = c.get(f"/v1/executions/{eid}/scores", headers=headers).json()
    assert [r["revision"] for r in revisions] == [0]


def test_a_retried_key_creation_issues_no_second_key(any_store: Store, setup: Any) -> None:
    c, headers, _ = setup
    before = n_rows(any_store, t.api_keys)
    h = {**headers, "Idempotency-Key": "key-1"}
    first = c.post("/v1/keys", json={"name": "ci", "scopes": ["read"]}, headers=h)
    again = c.post("/v1/keys", json={"name": "ci", "scopes": ["read"]}, headers=h)
    assert first.status_code == 201
    assert again.status_code == 409
    key_id = first.json()["key_id"]
    assert key_id in again.json()["error"]["message"]
    assert first.json()["key"].split(".")[1] not in again.text  # the secret is never stored or shown again
    assert n_rows(any_store, t.api_keys) == before + 1


@pytest.mark.parametrize("route", POSTS)
def test_the_same_key_with_another_body_is_refused(setup: Any, route: str) -> None:
    c, headers, eid = setup
    path = route.format(eid=eid)
    body, other = bodies(eid)[path]
    h = {**headers, "Idempotency-Key": f"reuse-{route[4:8]}"}
    assert c.post(path, json=body, headers=h).status_code == 201
    refused = c.post(path, json=other, headers=h)
    assert refused.status_code == 409
    message = refused.json()["error"]["message"]
    assert "Idempotency-Key" in message
    assert "different request" in message


def test_the_same_body_in_another_key_order_is_the_same_request(setup: Any) -> None:
    c, headers, _ = setup
    h = {**headers, "Idempotency-Key": "order", "Content-Type": "application/json"}
    first = c.post("/v1/runs", content=b'{"kind": "replay", "seed": 3}', headers=h)
    again = c.post("/v1/runs", content=b'{"seed":3,"kind":"replay"}', headers=h)
    assert again.status_code == first.status_code == 201
    assert again.content == first.content


def test_a_key_is_per_api_key_and_per_route(any_store: Store, setup: Any) -> None:
    c, headers, eid = setup
    other = make_keys(any_store).headers("all")
    h = {"Idempotency-Key": "shared"}
    a = c.post("/v1/runs", json={"kind": "replay"}, headers={**headers, **h})
    b = c.post("/v1/runs", json={"kind": "replay"}, headers={**other, **h})
    assert a.status_code == b.status_code == 201
    assert a.json()["run_id"] != b.json()["run_id"]
    reused = c.post(f"/v1/executions/{eid}/scores", json={"score": 1.0}, headers={**headers, **h})
    assert reused.status_code == 409
    assert "POST /v1/runs" in reused.json()["error"]["message"]


@pytest.mark.parametrize("key, status", [
    ("a", 201), ("A" * 128, 201), ("x-Y_z.0:9", 201),
    ("", 422), ("A" * 129, 422), ("has space", 422), ("é".encode(), 422), ("a/b", 422), ("a\tb", 422),
])
def test_keys_are_bounded_in_length_and_charset(any_store: Store, setup: Any, key: str | bytes, status: int) -> None:
    c, headers, _ = setup
    answer = c.post("/v1/runs", json={"kind": "replay"}, headers={**headers, "Idempotency-Key": key})
    assert answer.status_code == status, answer.text
    if status == 422:
        assert "Idempotency-Key" in answer.text
        assert n_runs(any_store) == 0


def test_concurrent_first_requests_with_one_key_do_the_work_once(any_store: Store) -> None:
    """Request A is inside its transaction, its run created, when request B (same key) starts.

    On PostgreSQL B is run to its end meanwhile: both found no stored answer, both created a run,
    B committed first, so A's insert hits the primary key, A's run rolls back and A answers B's
    answer. On SQLite B waits for A's write lock and then finds A's answer.
    """
    app = create_app(ApiSettings(), store=any_store)
    services = app.state.sapwood
    principal = Principal(key_id="0123456789abcdef", name="t", scopes=frozenset({"write"}))
    request = Request({"type": "http", "method": "POST", "path": "/v1/runs", "headers": [], "query_string": b""})
    body = RunCreate(kind="replay")
    serialized = any_store.engine.dialect.name == "sqlite"  # writers take the database's lock at BEGIN
    worked: list[str] = []
    answers: dict[str, Any] = {}

    def call(name: str, work: Any) -> None:
        answers[name] = idempotent(services, principal, "race", request, body, work)

    def plain_work(conn: Connection) -> Answer:
        worked.append("B")
        return Answer(201, json_bytes(RunCreated, create_run(conn, run_id=None, kind="replay", flt=body.filter,
                                                             seed=0, description="", config={})))

    b = threading.Thread(target=call, args=("B", plain_work))

    def racing_work(conn: Connection) -> Answer:
        answer = plain_work(conn)
        worked[-1] = "A"
        b.start()
        if not serialized:
            b.join(timeout=60)
            assert not b.is_alive()
        return answer

    call("A", racing_work)
    b.join(timeout=60)
    assert not b.is_alive()
    a_response, a_fresh = answers["A"]
    b_response, b_fresh = answers["B"]
    assert a_response.body == b_response.body
    assert n_runs(any_store) == 1
    if serialized:
        assert worked == ["A"]
        assert (a_fresh, b_fresh) == (True, False)
    else:
        assert worked == ["A", "B"]  # the race happened: both did the work, A's was rolled back
        assert (a_fresh, b_fresh) == (False, True)


def test_the_stored_answer_is_a_model_body(setup: Any) -> None:
    """What is stored is what the route documents (the JSON of its response model)."""
    c, headers, _ = setup
    answer = c.post("/v1/runs", json={"kind": "replay", "run_id": "named"}, headers={**headers, "Idempotency-Key": "m"})
    assert RunCreated.model_validate_json(answer.content).run_id == "named"
    assert isinstance(RunCreated.model_validate(answer.json()), BaseModel)
