"""Learner loop: a policy update writes a checkpoint and publishes the version as an event."""

from __future__ import annotations

from pathlib import Path

import torch

from sapwood.learner.config import CriticConfig, LearnerConfig, SourceConfig
from sapwood.learner.loop import Learner, latest_policy
from sapwood.learner.model import TinyActorCritic, TinyTransformerConfig, TorchBackend
from sapwood.learner.trainer import SAOTrainer
from sapwood.platform import runs
from sapwood.platform.store import Store
from tests.support.histories import small_execution


def test_update_checkpoints_and_publishes(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path / 's.db'}")
    for seed in range(2):
        store.apply(small_execution(seed, calls=6, forks=1, segments=2).events)
    with store.transaction() as conn:
        runs.create_run(conn, "r", runs.ExecutionFilter(), kind="live")
    backend = TorchBackend(TinyActorCritic(TinyTransformerConfig(vocab_size=500)))
    trainer = SAOTrainer(backend, LearnerConfig(critic=CriticConfig(warmup_steps=0)))
    learner = Learner(store, "r", trainer, checkpoint_dir=tmp_path / "ck",
                      source_config=SourceConfig(executions_per_batch=1))
    history = learner.run(idle_timeout_s=0.2)
    assert len(history) == 2
    assert history[-1]["policy/version"] == 2.0
    version, path = latest_policy(store, "r") or (None, "")
    assert version == 2
    assert Path(path).exists()
    state = torch.load(path, weights_only=False)["backend"]
    assert state["policy_version"] == 2
    fresh = TorchBackend(TinyActorCritic(TinyTransformerConfig(vocab_size=500)))
    fresh.load_state_dict(state)
    for a, b in zip(fresh.model.parameters(), backend.model.parameters(), strict=True):
        assert torch.equal(a, b)
    # a live run picks up executions that finish later
    store.apply(small_execution(9, calls=6, forks=1, segments=2).events)
    assert learner.step(timeout_s=1.0) is not None
