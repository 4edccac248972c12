"""/v1/runs/{run}/prompts/progress: per-epoch prompt queue progress on SQLite and PostgreSQL."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sapwood.platform import runs
from sapwood.platform.prompts import PromptRow, add_prompts
from sapwood.platform.storage.backends import prompt_queue
from sapwood.platform.store import Store
from tests.support.api_client import load_executions, make_client, make_keys


@pytest.fixture(params=["postgresql", "sqlite"])
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    url = request.getfixturevalue("pg_url") if request.param == "postgresql" else f"sqlite:///{tmp_path / 'p.db'}"
    store = Store.open(url)
    yield store
    store.close()


def test_progress_counts_every_state_per_epoch(any_store: Store) -> None:
    run_id = f"prompts-{uuid.uuid4().hex[:8]}"
    (finished,) = load_executions(any_store, 1, run_id=run_id)  # a success: its sample goes done
    with any_store.transaction() as conn:
        runs.create_run(conn, run_id, runs.ExecutionFilter(run_id=run_id), kind="live", seed=0)
        add_prompts(
            conn, run_id, [PromptRow(f"p{i}", f"t{i}", "fam", {}) for i in range(3)], samples_per_prompt=2, epochs=2
        )  # 3 × 2 = 6 samples per epoch
        q = prompt_queue(conn)
        a, b, c = q.claim(conn, run_id, "worker-a", 3, lease_s=60)
        assert q.attach(conn, run_id, "worker-a", a.sample_id, finished.execution_id)
        assert q.attach(conn, run_id, "worker-a", b.sample_id, str(uuid.uuid4()))
        q.release(conn, run_id, "worker-a", [b.sample_id])  # its half-recorded execution: abandoned
    keys = make_keys(any_store)
    with make_client(any_store) as client:
        r = client.get(f"/v1/runs/{run_id}/prompts/progress", headers=keys.headers("read"))
        missing = client.get("/v1/runs/no-such-run/prompts/progress", headers=keys.headers("read"))
        unauthorized = client.get(f"/v1/runs/{run_id}/prompts/progress")
    assert r.status_code == 200, r.text
    body = r.json()
    expected = {e: {"epoch": e, "pending": 6, "claimed": 0, "done": 0, "abandoned": 0} for e in (0, 1)}
    expected[a.epoch]["done"] += 1
    expected[a.epoch]["pending"] -= 1
    expected[b.epoch]["abandoned"] += 1  # b itself is pending again
    expected[c.epoch]["claimed"] += 1
    expected[c.epoch]["pending"] -= 1
    assert body["epochs"] == [expected[0], expected[1]]
    assert body["total"] == {"pending": 10, "claimed": 1, "done": 1, "abandoned": 1}
    assert body["samples"] == 12
    assert body["fraction_done"] == pytest.approx(1 / 12)
    assert missing.status_code == 404
    assert unauthorized.status_code == 401


def test_a_run_without_prompts_has_no_epochs(any_store: Store) -> None:
    run_id = f"noprompts-{uuid.uuid4().hex[:8]}"
    with any_store.transaction() as conn:
        runs.create_run(conn, run_id, runs.ExecutionFilter(run_id=run_id), kind="live", seed=0)
    keys = make_keys(any_store)
    with make_client(any_store) as client:
        body = client.get(f"/v1/runs/{run_id}/prompts/progress", headers=keys.headers("read")).json()
    assert body == {
        "run_id": run_id,
        "epochs": [],
        "total": {"pending": 0, "claimed": 0, "done": 0, "abandoned": 0},
        "samples": 0,
        "fraction_done": None,
    }
