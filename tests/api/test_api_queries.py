"""Query routes against PostgreSQL: executions, trees, summaries, trajectories, nodes, calls, runs, stats."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa

from sapwood.platform import schema as t
from sapwood.platform.store import Store
from sapwood.platform.writer import ExecutionWriter
from tests.support.api_client import Keys, TestClient, calls_of, latest_score, logical_trajectory, make_client

ROLE_CODES = {"prompt": 0, "observation": 1, "action": 2, "summary": 3}


def get(client: TestClient, keys: Keys, url: str, expect: int = 200, **params: Any) -> Any:
    r = client.get(url, headers=keys.headers("read"), params=params)
    assert r.status_code == expect, r.text
    return r.json()


def all_pages(client: TestClient, keys: Keys, url: str, **params: Any) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    cursor = None
    while True:
        page = get(client, keys, url, **params, **({"cursor": cursor} if cursor else {}))
        items += page["items"]
        cursor = page["next_cursor"]
        if cursor is None:
            return items


# -- executions ------------------------------------------------------------------------------------------
def test_list_executions_newest_first_with_keyset_pages(client: TestClient, keys: Keys,
                                                        writers: list[ExecutionWriter]) -> None:
    items = all_pages(client, keys, "/v1/executions", limit=1)
    assert [i["execution_id"] for i in items] == [w.execution_id for w in reversed(writers)]
    asc = all_pages(client, keys, "/v1/executions", limit=3, order="asc")
    assert [i["execution_id"] for i in asc] == [w.execution_id for w in writers]
    first = items[-1]
    assert first["n_calls"] == len(calls_of(writers[0]))
    assert first["n_segments"] == 3
    assert first["n_forks"] == 2
    assert first["status"] == "success"
    assert first["reward"] is not None


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"status": "timeout"}, [1, 3]),
        ({"status": ["success", "timeout"]}, [0, 1, 2, 3]),
        ({"task_id": "task-0"}, [0, 3]),
        ({"run_id": "rollout-a"}, [0, 1, 2, 3]),
        ({"run_id": "nope"}, []),
        ({"task_family": "swe"}, [0, 1, 2, 3]),
        ({"min_policy_version": 1}, []),
        ({"max_policy_version": 0}, [0, 1, 2, 3]),
        ({"task_id": "x' OR '1'='1"}, []),  # bound parameters: an injection attempt matches nothing
    ],
)
def test_execution_filters(client: TestClient, keys: Keys, writers: list[ExecutionWriter],
                           params: dict[str, Any], expected: list[int]) -> None:
    items = all_pages(client, keys, "/v1/executions", order="asc", **params)
    assert [i["execution_id"] for i in items] == [writers[k].execution_id for k in expected]


def test_score_and_time_filters(client: TestClient, keys: Keys, writers: list[ExecutionWriter]) -> None:
    rows = {i["execution_id"]: i for i in all_pages(client, keys, "/v1/executions")}
    scores = {eid: r["reward"] if r["reward"] is not None else r["score"] for eid, r in rows.items()}
    cut = sorted(scores.values())[1]
    got = {i["execution_id"] for i in all_pages(client, keys, "/v1/executions", min_score=cut)}
    assert got == {e for e, s in scores.items() if s >= cut}
    assert 0 < len(got) < 4
    got = {i["execution_id"] for i in all_pages(client, keys, "/v1/executions", max_score=cut)}
    assert got == {e for e, s in scores.items() if s <= cut}
    starts = sorted(r["started_at"] for r in rows.values())
    got = {i["execution_id"] for i in all_pages(client, keys, "/v1/executions", started_after=starts[2])}
    assert got == {e for e, r in rows.items() if r["started_at"] >= starts[2]}
    got = {i["execution_id"] for i in all_pages(client, keys, "/v1/executions", started_before=starts[2])}
    assert got == {e for e, r in rows.items() if r["started_at"] < starts[2]}
    timed_out = [w for w in writers if latest_score(w) is not None]
    assert {rows[w.execution_id]["score"] for w in timed_out} == {latest_score(w) for w in timed_out}


def test_bad_cursor_and_page_size(client: TestClient, keys: Keys, writers: list[ExecutionWriter]) -> None:
    body = get(client, keys, "/v1/executions", 422, cursor="bm90LWEtY3Vyc29y")
    assert body["error"]["code"] == "invalid"
    assert "cursor" in body["error"]["message"]
    calls_cursor = get(client, keys, f"/v1/executions/{writers[0].execution_id}/calls", limit=1)["next_cursor"]
    assert calls_cursor is not None
    get(client, keys, "/v1/executions", 422, cursor=calls_cursor)  # a cursor of another listing
    body = get(client, keys, "/v1/executions", 422, limit=5000)
    assert "largest page size" in body["error"]["message"]
    assert get(client, keys, "/v1/executions", 422, limit=0)["error"]["code"] == "invalid_request"


def test_get_execution_and_404(client: TestClient, keys: Keys, writers: list[ExecutionWriter]) -> None:
    w = writers[1]
    ex = get(client, keys, f"/v1/executions/{w.execution_id}")
    assert ex["status"] == "timeout"
    assert ex["score"] == latest_score(w)
    assert ex["final_reward"] is None
    assert ex["reward"] == ex["latest_score"] == latest_score(w)
    assert ex["reward_source"] == "partial_score"
    missing = get(client, keys, "/v1/executions/00000000-0000-4000-8000-000000000000", 404)
    assert missing["error"]["code"] == "not_found"
    assert get(client, keys, "/v1/executions/not-a-uuid", 422)["error"]["code"] == "invalid_request"


# -- trees -----------------------------------------------------------------------------------------------
def test_tree_has_every_node_with_roles_forks_segments_and_leaves(client: TestClient, keys: Keys,
                                                                  writers: list[ExecutionWriter]) -> None:
    w = writers[1]
    tree = get(client, keys, f"/v1/executions/{w.execution_id}/tree")
    nodes = {n["node_id"]: n for n in tree["nodes"]}
    assert set(nodes) == set(w.nodes)
    assert tree["n_nodes_total"] == len(w.nodes)
    assert not tree["truncated"]
    seen: set[str] = set()
    for n in tree["nodes"]:  # creation order: parents first
        up = n["parent_id"] or n["prev_segment_node"]
        assert up is None or up in seen
        seen.add(n["node_id"])
        wn = w.nodes[n["node_id"]]
        assert n["length"] == wn.tokens.size
        assert n["segment"] == wn.segment
        assert n["depth"] == wn.end - wn.tokens.size
        expected_role = {"prompt": "prompt", "observation": "observation", "action": "action",
                         "summary": "summary"}[wn.role]
        assert n["role"] == expected_role
        if up is not None:
            assert n["level"] == nodes[up]["level"] + 1
    assert set(tree["leaves"]) == set(w.leaves())
    assert len(tree["fork_points"]) == 2
    assert all(nodes[f]["fork_branches"] == 2 and nodes[f]["n_children"] == 2 for f in tree["fork_points"])
    assert [s["segment"] for s in tree["segments"]] == [0, 1, 2]
    assert tree["segments"][1]["from_node"] in nodes
    assert nodes[tree["segments"][1]["from_node"]]["role"] == "summary"
    assert [s["revision"] for s in tree["scores"]] == [0]
    assert tree["scores"][0]["score"] == latest_score(w)
    assert sum(n["length"] for n in tree["nodes"]) == tree["execution"]["n_tokens"]


def test_tree_limits_and_cache(client: TestClient, keys: Keys, writers: list[ExecutionWriter]) -> None:
    eid = writers[0].execution_id
    url = f"/v1/executions/{eid}/tree"
    small = get(client, keys, url, max_nodes=7)
    assert small["truncated"]
    assert len(small["nodes"]) == 7
    assert small["n_nodes_total"] == len(writers[0].nodes)
    full = get(client, keys, url)
    assert small["nodes"] == full["nodes"][:7]  # same facts (child counts over the whole tree)
    shallow = get(client, keys, url, max_level=3)
    assert shallow["truncated"]
    assert {n["level"] for n in shallow["nodes"]} == {0, 1, 2, 3}
    body = get(client, keys, url, 422, max_nodes=10**6)
    assert "SAPWOOD_API_TREE_MAX_NODES" in body["error"]["message"]
    r1 = client.get(url, headers=keys.headers("read"))
    r2 = client.get(url, headers={**keys.headers("read"), "If-None-Match": r1.headers["etag"]})
    assert r1.headers["x-sapwood-cache"] == "hit"
    assert r2.status_code == 304


def test_tree_of_an_unknown_execution(client: TestClient, keys: Keys, writers: list[ExecutionWriter]) -> None:
    for suffix in ("tree", "tree/summary"):
        body = get(client, keys, f"/v1/executions/00000000-0000-4000-8000-000000000000/{suffix}", 404)
        assert body["error"]["code"] == "not_found"


def test_tree_survives_lost_database_connections(client: TestClient, keys: Keys, pg_store: Store,
                                                 writers: list[ExecutionWriter]) -> None:
    url = f"/v1/executions/{writers[0].execution_id}/tree"
    before = get(client, keys, url)
    with pg_store.engine.connect() as conn:  # what a PostgreSQL restart does to idle connections
        conn.execute(sa.text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                             "WHERE datname = current_database() AND pid <> pg_backend_pid()"))
    pg_store.engine.dispose()
    assert get(client, keys, url) == before


def test_tree_changes_after_a_score_revision(client: TestClient, keys: Keys, writers: list[ExecutionWriter]) -> None:
    eid = writers[0].execution_id
    before = get(client, keys, f"/v1/executions/{eid}/tree")
    r = client.post(f"/v1/executions/{eid}/scores", headers=keys.headers("write"), json={"score": 0.25})
    assert r.status_code == 201, r.text
    after = get(client, keys, f"/v1/executions/{eid}/tree")
    assert after["execution"]["last_seq"] == before["execution"]["last_seq"] + 1
    assert [s["score"] for s in after["scores"]] == [0.25]


def test_tree_summary_collapses_chains(client: TestClient, keys: Keys, writers: list[ExecutionWriter]) -> None:
    w = writers[0]
    summary = get(client, keys, f"/v1/executions/{w.execution_id}/tree/summary")
    kept = {n["node_id"]: n for n in summary["nodes"]}
    assert set(w.leaves()) <= set(kept)
    kinds = [k for n in summary["nodes"] for k in n["kinds"]]
    assert kinds.count("fork") == 2
    assert kinds.count("segment_root") == 2
    assert kinds.count("compacted") == 2
    assert kinds.count("root") == 1
    assert len(kept) < len(w.nodes) / 3
    collapsed = sum(e["n_nodes"] for e in summary["edges"])
    assert collapsed + len(kept) == len(w.nodes)
    tokens = sum(e["n_tokens"] for e in summary["edges"]) + sum(n["length"] for n in summary["nodes"])
    assert tokens == summary["execution"]["n_tokens"]
    assert sum(1 for e in summary["edges"] if e["kind"] == "segment") == 2
    for e in summary["edges"]:
        assert e["parent"] in kept
        assert e["child"] in kept
        assert sum(e["tokens_by_role"].values()) == e["n_tokens"]


# -- trajectories and nodes ------------------------------------------------------------------------------
def test_trajectories_list_matches_leaves(client: TestClient, keys: Keys, writers: list[ExecutionWriter]) -> None:
    w = writers[0]
    items = get(client, keys, f"/v1/executions/{w.execution_id}/trajectories")["items"]
    assert {i["leaf_node_id"] for i in items} == set(w.leaves())
    for item in items:
        expected = logical_trajectory(w, item["leaf_node_id"])
        assert item["n_tokens"] == expected.tokens.size
        assert item["n_segments"] == len(expected.segment_starts)


def test_trajectory_pages_rebuild_the_logical_trajectory(client: TestClient, keys: Keys,
                                                         writers: list[ExecutionWriter]) -> None:
    w = writers[1]
    leaf = max(w.leaves(), key=lambda n: w.nodes[n].segment)
    expected = logical_trajectory(w, leaf)
    calls = {c.event_id: c for c in calls_of(w)}
    ids: list[int] = []
    offset: int | None = 0
    pages = 0
    while offset is not None:
        page = get(client, keys, f"/v1/nodes/{leaf}/trajectory", offset=offset, limit=97)
        assert page["offset"] == offset
        assert page["n_tokens"] == expected.tokens.size
        for piece in page["pieces"]:
            assert piece["offset"] == len(ids)  # pieces are contiguous across pages
            ids += piece["token_ids"]
            if piece["role"] in ("action", "summary"):
                call = calls[piece["call_id"]]
                start = piece["offset"] - next(n["offset"] for n in page["nodes"] if n["node_id"] == piece["node_id"])
                want = call.output_logprobs[start:start + len(piece["token_ids"])]
                assert np.array_equal(np.array(piece["logprobs"], dtype=np.float32), want)
            else:
                assert piece["logprobs"] is None
        offset = page["next_offset"]
        pages += 1
    assert pages > 2
    assert np.array_equal(np.array(ids, dtype=np.int32), expected.tokens)
    assert [s["offset"] for s in page["segments"]] == expected.segment_starts
    assert page["reward"] == latest_score(w)
    past = get(client, keys, f"/v1/nodes/{leaf}/trajectory", offset=10**9)  # past the end: an empty last page
    assert past["pieces"] == []
    assert past["next_offset"] is None
    assert past["n_tokens"] == expected.tokens.size


def test_trajectory_of_a_growing_execution(client: TestClient, keys: Keys, pg_store: Store) -> None:
    from sapwood.platform.synthetic import synthetic_execution
    from tests.support.api_client import small_config

    w = synthetic_execution(small_config(7))
    calls = calls_of(w)
    cut = w.events.index(calls[1]) + 1
    pg_store.apply(w.events[:cut])  # running: the second call's output is a leaf for now
    node = calls[1].output_node_id
    first = get(client, keys, f"/v1/nodes/{node}/trajectory")
    assert first["is_leaf"]
    assert first["n_tokens"] == w.context_length(node)
    pg_store.apply(w.events[cut:])
    later = get(client, keys, f"/v1/nodes/{node}/trajectory")  # same (cached) path, fresh leaf flag
    assert not later["is_leaf"]
    assert later["nodes"] == first["nodes"]
    assert later["pieces"] == first["pieces"]


def test_node_detail_tokens_and_logprobs(client: TestClient, keys: Keys, writers: list[ExecutionWriter]) -> None:
    w = writers[0]
    call = calls_of(w)[3]
    node = get(client, keys, f"/v1/nodes/{call.output_node_id}", offset=1, limit=2)
    assert node["role"] == "action"
    assert node["call_id"] == call.event_id
    assert node["text"] is None
    assert node["token_ids"] == call.output_ids[1:3].tolist()
    assert np.array_equal(np.array(node["logprobs"], dtype=np.float32), call.output_logprobs[1:3])
    assert node["next_offset"] == (3 if call.output_ids.size > 3 else None)
    assert node["level"] > 0
    assert node["n_children"] == 1
    get(client, keys, "/v1/nodes/00000000-0000-4000-8000-000000000000", 404)
    body = get(client, keys, f"/v1/nodes/{call.output_node_id}", 422, limit=10**6)
    assert "SAPWOOD_API_MAX_TOKEN_PAGE" in body["error"]["message"]


def test_calls_of_an_execution(client: TestClient, keys: Keys, writers: list[ExecutionWriter]) -> None:
    w = writers[2]
    items = all_pages(client, keys, f"/v1/executions/{w.execution_id}/calls", limit=5)
    assert [i["call_id"] for i in items] == [c.event_id for c in calls_of(w)]
    assert {i["call_kind"] for i in items} == {"action", "summary"}
    get(client, keys, "/v1/executions/00000000-0000-4000-8000-000000000000/calls", 404)


# -- runs and stats --------------------------------------------------------------------------------------
def test_runs_list_rollout_and_training_runs(client: TestClient, keys: Keys, writers: list[ExecutionWriter]) -> None:
    r = client.post("/v1/runs", headers=keys.headers("write"), json={"run_id": "r-1", "seed": 1})
    assert r.status_code == 201, r.text
    runs = all_pages(client, keys, "/v1/runs", limit=1)
    by_id = {r["run_id"]: r for r in runs}
    assert [r["run_id"] for r in runs] == ["r-1", "rollout-a"]
    assert by_id["rollout-a"]["kind"] is None
    assert by_id["rollout-a"]["executions"] == {"success": 2, "timeout": 2}
    assert by_id["r-1"]["kind"] == "replay"
    assert by_id["r-1"]["progress"]["pending"] == 4
    assert get(client, keys, "/v1/runs/rollout-a")["progress"] is None
    assert get(client, keys, "/v1/runs/nope", 404)["error"]["code"] == "not_found"


def test_stats_counts_tokens_and_dedup(client: TestClient, keys: Keys, writers: list[ExecutionWriter],
                                       pg_store: Store) -> None:
    stats = get(client, keys, "/v1/stats")
    assert stats["calls"] == sum(len(calls_of(w)) for w in writers)
    assert stats["nodes"] == sum(len(w.nodes) for w in writers)
    assert stats["tree_tokens"] == sum(n.tokens.size for w in writers for n in w.nodes.values())
    naive = sum(c.output_ids.size + w.context_length(c.output_node_id) - c.output_ids.size
                for w in writers for c in calls_of(w))
    assert stats["naive_tokens"] == naive
    assert stats["dedup_ratio"] == round(naive / stats["tree_tokens"], 3)
    # the system prompt is identical in every execution: stored once
    assert stats["unique_tokens"] < stats["tree_tokens"]
    assert stats["span_dedup_ratio"] > 1
    assert stats["ingest_lag"] is None
    assert "SAPWOOD_KAFKA_BOOTSTRAP" in stats["ingest_lag_reason"]
    with pg_store.transaction() as conn:
        conn.execute(t.consumer_offsets.insert().values(group_id="g", topic="sapwood.events", partition=0,
                                                        next_offset=5, updated_at=0.0))
    with make_client(pg_store, kafka_bootstrap="127.0.0.1:1", api_lag_timeout_s=1.0) as c:
        stats = c.get("/v1/stats", headers=keys.headers("read")).json()
    assert stats["ingest_lag"] is None
    assert "unreachable" in stats["ingest_lag_reason"]
