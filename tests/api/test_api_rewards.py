"""One reward rule: the reward the API shows equals the reward the learner's batch source trains on.

Success, timeout with and without a partial score, error, and per-leaf rewards, each through the
real FastAPI app on a SQLite store and through ``build_batch``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sapwood.learner.assembly import build_batch
from sapwood.learner.config import SourceConfig
from sapwood.platform.store import Store
from sapwood.platform.writer import ExecutionWriter
from tests.support.api_client import Keys, TestClient, make_client, make_keys

# name -> (status, final reward, partial scores, per-leaf rewards for leaf 0, expected source of leaf 1)
CASES: dict[str, tuple[str, float | None, list[float], float | None, str | None]] = {
    "success": ("success", 0.75, [0.2], None, "final"),
    "success_leaf": ("success", 0.5, [], -1.5, "final"),
    "success_unrewarded": ("success", None, [0.4], None, "partial_score"),
    "timeout_scored": ("timeout", None, [0.1, 0.3], None, "partial_score"),
    "timeout_unscored": ("timeout", None, [], None, "zero: timeout"),
    "error": ("error", 0.9, [0.6], None, "excluded: error"),
}


def _execution(seed: int, status: str, reward: float | None, scores: list[float], leaf0: float | None
               ) -> ExecutionWriter:
    """Two trajectories forking after a shared prompt; finished with ``status``."""
    rng = np.random.default_rng(seed)
    w = ExecutionWriter(run_id="rewards", task_id=f"t{seed}", vocab_size=100)
    w.start()
    root = w.prompt(rng.integers(0, 100, 12)).node_id
    w.fork(root, 2)
    leaves = [w.call(root, [1 + i], rng.integers(0, 100, 5), -rng.random(5)).output_node_id for i in range(2)]
    for s in scores:
        w.score(s)
    w.finish(status, reward, leaf_rewards={leaves[0]: leaf0} if leaf0 is not None else None)
    return w


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store.open(f"sqlite:///{tmp_path / 'rewards.db'}")


@pytest.fixture
def executions(store: Store) -> dict[str, ExecutionWriter]:
    out = {}
    for seed, (name, (status, reward, scores, leaf0, _)) in enumerate(CASES.items()):
        w = _execution(seed, status, reward, scores, leaf0)
        store.apply(w.events)
        out[name] = w
    return out


@pytest.fixture
def client(store: Store) -> Iterator[TestClient]:
    with make_client(store) as c:
        yield c


def _get(client: TestClient, keys: Keys, path: str) -> Any:
    r = client.get(path, headers=keys.headers("read"))
    assert r.status_code == 200, r.text
    return r.json()


def _trained(store: Store, execution_id: str) -> list[float] | None:
    """Sorted leaf rewards the learner's batch holds for the execution; None if it left it out."""
    batch, used = build_batch(store, [execution_id], SourceConfig(jmax=8))
    if execution_id not in used:
        return None
    values = batch.leaf_reward[~batch.leaf_reward.isnan()].tolist()
    assert len(values) == 2  # both leaves of the fork
    return sorted(values)


def test_api_shows_the_reward_the_learner_trains_on(store: Store, client: TestClient,
                                                    executions: dict[str, ExecutionWriter]) -> None:
    keys = make_keys(store)
    for name, w in executions.items():
        status, final, scores, leaf0, source = CASES[name]
        eid = w.execution_id
        trained = _trained(store, eid)
        trajectories = _get(client, keys, f"/v1/executions/{eid}/trajectories")["items"]
        shown = [item["reward"] for item in trajectories]
        pages = [_get(client, keys, f"/v1/nodes/{item['leaf_node_id']}/trajectory") for item in trajectories]
        assert [p["reward"] for p in pages] == shown, name
        if trained is None:
            assert shown == [None, None], name
            assert status == "error", name
        else:
            assert None not in shown, name
            assert sorted(shown) == pytest.approx(trained, abs=1e-6), name
        ex = _get(client, keys, f"/v1/executions/{eid}")
        assert ex["final_reward"] == final, name
        assert ex["latest_score"] == (scores[-1] if scores else None), name
        assert ex["reward_source"] == source, name
        for item in trajectories + pages:  # raw values beside the trained reward, per trajectory too
            assert item["final_reward"] == final, name
            assert item["latest_score"] == ex["latest_score"], name
        unleafed = [i for i in trajectories if i["reward_source"] != "leaf"]
        assert len(unleafed) == (1 if leaf0 is not None else 2), name
        assert all(i["reward"] == ex["reward"] and i["reward_source"] == source for i in unleafed), name


def test_each_case_resolves_as_documented(store: Store, executions: dict[str, ExecutionWriter]) -> None:
    """The learner side, spelled out: what each status trains on under the default policy."""
    got = {name: _trained(store, w.execution_id) for name, w in executions.items()}
    assert got["success"] == [0.75, 0.75]
    assert got["success_leaf"] == [-1.5, 0.5]  # the recorded leaf reward wins for its leaf
    assert got["success_unrewarded"] == pytest.approx([0.4, 0.4])
    assert got["timeout_scored"] == pytest.approx([0.3, 0.3])  # the latest partial score, not the first
    assert got["timeout_unscored"] == [0.0, 0.0]
    assert got["error"] is None  # left out of training although it reported a final reward
    assert not any(v is not None and any(math.isnan(x) for x in v) for v in got.values())
