"""Replay end to end: historical executions → a replay run created over the REST API → a learner trains on it."""

from __future__ import annotations

import pytest
import torch

from sapwood.learner.config import CriticConfig, LearnerConfig, SourceConfig
from sapwood.learner.loop import Learner, latest_policy
from sapwood.learner.model import TinyActorCritic, TinyTransformerConfig, TorchBackend
from sapwood.learner.trainer import SAOTrainer
from sapwood.platform.store import Store
from sapwood.platform.synthetic import SynthConfig, synthetic_execution
from tests.support.api_client import make_client, make_keys
from tests.support.histories import SMALL

pytestmark = pytest.mark.postgres


def _learner(store: Store, run_id: str, name: str) -> Learner:
    torch.manual_seed(0)
    backend = TorchBackend(TinyActorCritic(TinyTransformerConfig(vocab_size=SMALL.vocab_size)))
    trainer = SAOTrainer(backend, LearnerConfig(critic=CriticConfig(warmup_steps=1)))
    return Learner(store, run_id, trainer, learner_id=name, source_config=SourceConfig(executions_per_batch=2))


def test_replay_history_into_a_fresh_run_and_train(pg_url: str, tmp_path) -> None:
    store = Store.open(pg_url)
    history = []
    for seed in range(5):
        status = "timeout" if seed % 2 else "success"
        cfg = SynthConfig(**{**SMALL.__dict__, "seed": seed, "calls": 8, "status": status})
        history.append(synthetic_execution(cfg, run_id="rollout-a"))
        store.apply(history[-1].events)
    keys = make_keys(store)
    with make_client(store) as client:
        body = {"run_id": "replay-1", "kind": "replay", "filter": {"run_id": "rollout-a"}, "seed": 7}
        created = client.post("/v1/runs", json=body, headers=keys.headers("write"))
        assert created.status_code == 201, created.text
        twin = client.post("/v1/runs", json={**body, "run_id": "replay-2"}, headers=keys.headers("write"))
        assert twin.status_code == 201
        order = [client.get(f"/v1/runs/{r}/items", headers=keys.headers("read")).json() for r in ("replay-1",
                                                                                                "replay-2")]
        ids = [[item["execution_id"] for item in page["items"]] for page in order]
        assert ids[0] == ids[1]
        assert sorted(ids[0]) == sorted(w.execution_id for w in history)

        learner = _learner(store, "replay-1", "L1")
        learner.checkpoint_dir = tmp_path / "ckpt"
        history_metrics = learner.run(idle_timeout_s=0.5)
        assert len(history_metrics) == 3
        assert learner.lost_claims == 0  # 5 executions, 2 per batch
        assert all(m["learner/lost_claims"] == 0 for m in history_metrics)
        # the trained batches carried the recorded rollout log-probs: DIS ratios are finite and measured
        assert all(m["policy/ratio_mean"] > 0 for m in history_metrics[1:])
        progress = client.get("/v1/runs/replay-1", headers=keys.headers("read")).json()
        assert {k: progress["progress"][k] for k in ("pending", "claimed", "done")} == {
            "pending": 0, "claimed": 0, "done": 5}, progress
        assert latest_policy(store, "replay-1") is not None

        # the run is consumed exactly once: a second learner finds nothing
        assert _learner(store, "replay-1", "L2").step(timeout_s=0.3) is None
    store.close()
