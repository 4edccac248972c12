"""Training checkpoints: named by digest, refused when the bytes differ, complete enough to continue."""

from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from sapwood.learner.assembly import build_batch
from sapwood.learner.checkpoint import (
    CheckpointError,
    read_checkpoint,
    remove_unpublished,
    restore_training_state,
    training_state,
    write_checkpoint,
)
from sapwood.learner.config import CriticConfig, LearnerConfig, SourceConfig
from sapwood.learner.model import TinyActorCritic, TinyTransformerConfig, TorchBackend
from sapwood.learner.trainer import SAOTrainer
from sapwood.platform.store import Store
from tests.support.histories import small_execution


def _trainer(seed: int) -> SAOTrainer:
    torch.manual_seed(seed)
    backend = TorchBackend(TinyActorCritic(TinyTransformerConfig(vocab_size=500)))
    return SAOTrainer(backend, LearnerConfig(critic=CriticConfig(warmup_steps=1)))


@pytest.fixture(scope="module")
def batches(tmp_path_factory: pytest.TempPathFactory) -> list:
    store = Store.open(f"sqlite:///{tmp_path_factory.mktemp('ck') / 's.db'}")
    ids = []
    for seed in range(3):
        w = small_execution(seed, calls=6, forks=1, segments=2)
        store.apply(w.events)
        ids.append(w.execution_id)
    return [build_batch(store, [e], SourceConfig())[0] for e in ids]


def test_a_restored_trainer_continues_exactly_as_the_original(tmp_path: Path, batches: list) -> None:
    original = _trainer(0)
    original.train_step(batches[0])  # critic warm-up
    original.train_step(batches[1])  # joint step: version 1, AdamW moments, EMA
    written = write_checkpoint(tmp_path, 1, training_state(original))
    assert written.path.name == f"policy-v000001-{written.digest[:16]}.pt"
    random.random(), np.random.rand(), torch.rand(1)  # move every RNG on: the checkpoint must restore them
    restored = _trainer(99)  # other initial weights
    restore_training_state(restored, read_checkpoint(written.path, written.digest))
    assert (restored.steps, restored.critic_warmup_done, restored.value_loss_ema) == (
        original.steps, original.critic_warmup_done, original.value_loss_ema)
    after_restore = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    restore_training_state(original, read_checkpoint(written.path, written.digest))
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == after_restore
    a, b = original.train_step(batches[2]), restored.train_step(batches[2])
    assert a["train/loss"] == b["train/loss"]
    assert restored.backend.policy_version == 2
    for p, q in zip(original.backend.model.parameters(), restored.backend.model.parameters(), strict=True):
        assert torch.equal(p, q)


def test_a_checkpoint_whose_bytes_differ_from_the_digest_is_refused(tmp_path: Path) -> None:
    written = write_checkpoint(tmp_path, 3, training_state(_trainer(0)))
    data = bytearray(written.path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    written.path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="SHA-256"):
        read_checkpoint(written.path, written.digest)
    with pytest.raises(CheckpointError, match="cannot be read"):
        read_checkpoint(tmp_path / "gone.pt", written.digest)


def test_unpublished_checkpoints_are_removed_after_the_grace_period_only(tmp_path: Path) -> None:
    state = training_state(_trainer(0))
    published = write_checkpoint(tmp_path, 1, state).path
    orphan = write_checkpoint(tmp_path, 2, {**state, "policy_version": 2}).path
    tmp = tmp_path / ".policy-v000003.1a2b.tmp"
    tmp.write_bytes(b"partial")
    other = tmp_path / "notes.txt"
    other.write_text("not a checkpoint")
    now = orphan.stat().st_mtime
    assert remove_unpublished(tmp_path, [str(published)], grace_s=10.0, now=now + 10.0) == []  # at the boundary
    for p in (published, orphan, tmp, other):
        os.utime(p, (now - 100.0, now - 100.0))
    assert remove_unpublished(tmp_path, [str(published)], grace_s=10.0, now=now) == sorted([orphan, tmp])
    assert published.exists()
    assert other.exists()
    assert not orphan.exists()
    assert not tmp.exists()
