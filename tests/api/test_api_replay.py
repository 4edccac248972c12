"""Replay runs (reproducible order, progress) and partial-score revisions through the API."""

from __future__ import annotations

from typing import Any

from sapwood.platform import runs as platform_runs
from sapwood.platform.store import Store
from sapwood.platform.writer import ExecutionWriter
from tests.support.api_client import Keys, TestClient, load_executions


def post(client: TestClient, keys: Keys, url: str, body: dict[str, Any], expect: int = 201) -> Any:
    r = client.post(url, headers=keys.headers("write"), json=body)
    assert r.status_code == expect, r.text
    return r.json()


def items(client: TestClient, keys: Keys, run_id: str, limit: int = 2) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": limit, **({"cursor": cursor} if cursor else {})}
        page = client.get(f"/v1/runs/{run_id}/items", headers=keys.headers("read"), params=params).json()
        out += page["items"]
        cursor = page["next_cursor"]
        if cursor is None:
            return out


def test_replay_runs_are_reproducible(client: TestClient, keys: Keys, pg_store: Store,
                                      writers: list[ExecutionWriter]) -> None:
    more = load_executions(pg_store, 4, first_seed=10)
    every = {w.execution_id for w in writers + more}
    a = post(client, keys, "/v1/runs", {"run_id": "replay-a", "seed": 7, "filter": {"run_id": "rollout-a"},
                                        "description": "critic warm-up", "config": {"lr": 1e-5}})
    assert a["queued"] == 8
    assert a["kind"] == "replay"
    assert a["progress"] == {"pending": 8, "claimed": 0, "done": 0,
                              "total": 8}
    assert a["filter"] == {"run_id": "rollout-a"}
    assert a["config"] == {"lr": 1e-5}
    b = post(client, keys, "/v1/runs", {"run_id": "replay-b", "seed": 7, "filter": {"run_id": "rollout-a"}})
    c = post(client, keys, "/v1/runs", {"seed": 8, "filter": {"run_id": "rollout-a"}})
    assert c["run_id"].startswith("replay-")
    order_a = [i["execution_id"] for i in items(client, keys, "replay-a")]
    order_b = [i["execution_id"] for i in items(client, keys, b["run_id"])]
    order_c = [i["execution_id"] for i in items(client, keys, c["run_id"], limit=100)]
    assert set(order_a) == every
    assert order_a == order_b  # same filter + seed: same executions, same order
    assert set(order_c) == every
    assert order_c != order_a  # another seed: another order (1 in 8! by chance)
    assert [i["position"] for i in items(client, keys, "replay-a", limit=3)] == list(range(8))


def test_replay_selects_only_finished_matching_executions(client: TestClient, keys: Keys,
                                                          writers: list[ExecutionWriter]) -> None:
    run = post(client, keys, "/v1/runs", {"run_id": "timeouts", "filter": {"status": ["timeout"], "task_id": "task-1"}})
    assert [i["execution_id"] for i in items(client, keys, "timeouts")] == [writers[1].execution_id]
    assert run["queued"] == 1


def test_run_progress_follows_learner_claims(client: TestClient, keys: Keys, pg_store: Store,
                                             writers: list[ExecutionWriter]) -> None:
    post(client, keys, "/v1/runs", {"run_id": "r", "seed": 1})
    with pg_store.transaction() as conn:
        claimed = platform_runs.claim(conn, "r", "learner-1", 3)
        platform_runs.complete(conn, "r", "learner-1", claimed[:1])
    run = client.get("/v1/runs/r", headers=keys.headers("read")).json()
    assert run["progress"] == {"pending": 1, "claimed": 2, "done": 1, "total": 4}
    states = {i["execution_id"]: i["state"] for i in items(client, keys, "r")}
    assert states[claimed[0]] == "done"
    assert sorted(states.values()) == ["claimed", "claimed", "done", "pending"]


def test_duplicate_and_invalid_runs(client: TestClient, keys: Keys, writers: list[ExecutionWriter]) -> None:
    post(client, keys, "/v1/runs", {"run_id": "dup"})
    err = post(client, keys, "/v1/runs", {"run_id": "dup"}, expect=409)
    assert err["error"]["code"] == "conflict"
    assert "already exists" in err["error"]["message"]
    for body in ({"run_id": "bad id"}, {"filter": {"nope": 1}}, {"seed": -1}, {"kind": "other"},
                 {"config": {"x": "a\x00b"}}, {"filter": {"task_id": "a\x00"}}):
        err = post(client, keys, "/v1/runs", body, expect=422)
        assert err["error"]["code"] == "invalid_request"
    r = client.post("/v1/runs", headers={**keys.headers("write"), "Content-Type": "application/json"},
                    content=b'{"filter": {"min_score": NaN}}')
    assert r.status_code == 422


def test_score_revisions(client: TestClient, keys: Keys, writers: list[ExecutionWriter]) -> None:
    w = writers[1]  # timed out, partial score revision 0 from the producer
    url = f"/v1/executions/{w.execution_id}/scores"
    s1 = post(client, keys, url, {"score": 0.9, "components": {"tests_passed": 0.9}, "scorer": "rescorer",
                                  "note": "flaky test fixed", "expected_revision": 1})
    assert s1["revision"] == 1
    assert s1["scorer"] == "rescorer"
    s2 = post(client, keys, url, {"score": 0.95})
    assert s2["revision"] == 2
    err = post(client, keys, url, {"score": 0.1, "expected_revision": 2}, expect=409)
    assert "next revision is 3" in err["error"]["message"]
    revisions = client.get(url, headers=keys.headers("read")).json()
    assert [(s["revision"], s["score"]) for s in revisions][1:] == [(1, 0.9), (2, 0.95)]
    ex = client.get(f"/v1/executions/{w.execution_id}", headers=keys.headers("read")).json()
    assert ex["score"] == 0.95
    assert ex["score_revision"] == 2
    found = client.get("/v1/executions", headers=keys.headers("read"), params={"min_score": 0.94}).json()["items"]
    assert w.execution_id in {e["execution_id"] for e in found}
    for bad in ({"score": "x"}, {"score": 1.0, "scorer": "s" * 200}, {"score": 1.0, "extra": 1}):
        assert post(client, keys, url, bad, expect=422)["error"]["code"] == "invalid_request"
    assert post(client, keys, "/v1/executions/00000000-0000-4000-8000-000000000000/scores", {"score": 1.0},
                expect=404)["error"]["code"] == "not_found"


def test_a_running_execution_cannot_be_scored_through_the_api(client: TestClient, keys: Keys,
                                                               pg_store: Store) -> None:
    from sapwood.platform.synthetic import synthetic_execution
    from tests.support.api_client import small_config

    w = synthetic_execution(small_config(3))
    pg_store.apply(w.events[:-1])  # not finished
    err = post(client, keys, f"/v1/executions/{w.execution_id}/scores", {"score": 0.5}, expect=409)
    assert "still running" in err["error"]["message"]
    pg_store.apply(w.events[-1:])  # the producer's next seq is still free
    assert post(client, keys, f"/v1/executions/{w.execution_id}/scores", {"score": 0.5})["revision"] == 0
