"""The atomic step commit: claims go done with the version that trained them, or not at all."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sapwood.learner.audit import audit_training
from sapwood.learner.checkpoint import CheckpointError
from sapwood.learner.claims import ClaimedBatch
from sapwood.learner.config import CriticConfig, LearnerConfig, SourceConfig
from sapwood.learner.loop import Learner, latest_policy
from sapwood.learner.model import TinyActorCritic, TinyTransformerConfig, TorchBackend
from sapwood.learner.trainer import SAOTrainer
from sapwood.platform import runs
from sapwood.platform.events import PolicyPublished
from sapwood.platform.storage.learner_reads import policy_history
from sapwood.platform.store import Store
from tests.support.replay_store import replay_store


def _learner(store: Store, ckpt: Path, name: str, *, warmup: int = 0) -> Learner:
    torch.manual_seed(0)
    backend = TorchBackend(TinyActorCritic(TinyTransformerConfig(vocab_size=500)))
    trainer = SAOTrainer(backend, LearnerConfig(critic=CriticConfig(warmup_steps=warmup)))
    return Learner(store, "train", trainer, learner_id=name, checkpoint_dir=ckpt, checkpoint_grace_s=0.0,
                   source_config=SourceConfig(executions_per_batch=1))


def _lose_the_claim_during_the_step(learner: Learner, store: Store, claimed: ClaimedBatch) -> None:
    """The next training step of learner A outlives its lease: learner B takes ``claimed`` over meanwhile."""
    original = learner.trainer.train_step

    def step_then_lose_the_claim(batch):  # type: ignore[no-untyped-def]
        metrics = original(batch)
        with store.transaction() as conn:
            runs.release(conn, "train", "A", claimed.execution_ids)
            assert runs.claim(conn, "train", "B", 1, lease_s=600.0) == claimed.execution_ids
        return metrics

    learner.trainer.train_step = step_then_lose_the_claim  # type: ignore[method-assign]


def test_each_version_names_the_executions_it_trained_and_warm_up_batches_commit_with_the_next(
        tmp_path: Path) -> None:
    _, store, _ = replay_store(tmp_path / "s.db", 4)
    learner = _learner(store, tmp_path / "ck", "L", warmup=1)
    first = learner.step()
    assert first is not None
    assert first["train/critic_warmup"] == 1.0
    with store.transaction() as conn:  # the warm-up step is trained but not committed: still claimed
        assert runs.run_progress(conn, "train") == {"pending": 3, "claimed": 1, "done": 0}
    learner.run(idle_timeout_s=0.0)
    audit = audit_training(store, "train")
    assert audit.ok, audit
    assert audit.versions == [1, 2, 3]
    assert audit.trained == 4
    with store.transaction() as conn:
        first_version = policy_history(conn, "train")[0][2]
    assert len(first_version["execution_ids"]) == 2
    assert first_version["batches"] == 2  # warm-up + joint step


def test_a_claim_lost_during_the_step_rolls_the_commit_back_and_reloads_the_published_state(
        tmp_path: Path) -> None:
    _, store, _ = replay_store(tmp_path / "s.db", 3)
    learner = _learner(store, tmp_path / "ck", "A")
    assert learner.step() is not None  # version 1 committed
    v1 = [p.clone() for p in learner.backend.model.parameters()]
    claimed = learner.source.next_batch()
    assert claimed is not None
    _lose_the_claim_during_the_step(learner, store, claimed)
    assert learner.train(claimed) is None
    assert learner.lost_claims == 1
    assert latest_policy(store, "train")[0] == 1  # type: ignore[index]
    assert learner.backend.policy_version == 1
    for p, q in zip(learner.backend.model.parameters(), v1, strict=True):
        assert torch.equal(p, q)  # the update on B's execution is gone from A's weights
    assert list((tmp_path / "ck").glob("policy-v000002-*.pt")) == []  # the unpublished checkpoint was removed
    with store.transaction() as conn:
        assert runs.run_progress(conn, "train") == {"pending": 1, "claimed": 1, "done": 1}


def test_two_learners_on_one_run_publish_contiguous_versions_each_execution_once(tmp_path: Path) -> None:
    _, store, _ = replay_store(tmp_path / "s.db", 4)
    a, b = _learner(store, tmp_path / "ck", "A"), _learner(store, tmp_path / "ck", "B")
    assert b.step() is not None  # B publishes version 1
    # A, still at version 0, trains the next execution and loses the race for version 1: its commit rolls
    # back, the execution returns to the queue, and A continues from B's published checkpoint
    assert a.step() is None
    assert a.lost_claims == 1
    assert a.backend.policy_version == 1
    for p, q in zip(a.backend.model.parameters(), b.backend.model.parameters(), strict=True):
        assert torch.equal(p, q)
    assert a.step() is not None
    assert a.backend.policy_version == 2
    b.resume()
    b.run(idle_timeout_s=0.0)
    audit = audit_training(store, "train")
    assert audit.ok, audit
    assert audit.versions == [1, 2, 3, 4], audit
    assert audit.trained == 4, audit


def test_a_version_published_without_a_digest_cannot_be_returned_to(tmp_path: Path) -> None:
    _, store, _ = replay_store(tmp_path / "s.db", 2)
    learner = _learner(store, tmp_path / "ck", "A")
    store.apply([PolicyPublished(run_id="train", version=1, checkpoint="", metadata={"learner": "other"})])
    with pytest.raises(CheckpointError, match="without a digest"):
        learner.step()
    assert learner.lost_claims == 1
    with store.transaction() as conn:
        assert runs.run_progress(conn, "train") == {"pending": 2, "claimed": 0, "done": 0}


def test_resume_refuses_a_published_checkpoint_whose_digest_does_not_match(tmp_path: Path) -> None:
    _, store, _ = replay_store(tmp_path / "s.db", 1)
    learner = _learner(store, tmp_path / "ck", "A")
    assert learner.step() is not None
    _, path = latest_policy(store, "train")  # type: ignore[misc]
    Path(path).write_bytes(Path(path).read_bytes() + b"tampered")
    with pytest.raises(CheckpointError, match="SHA-256"):
        _learner(store, tmp_path / "ck", "B").resume()


def test_a_claim_lost_before_the_first_version_returns_to_the_state_the_learner_started_from(
        tmp_path: Path) -> None:
    _, store, _ = replay_store(tmp_path / "s.db", 2)
    learner = _learner(store, tmp_path / "ck", "A")
    assert learner.resume() is None  # nothing published yet
    start = [p.clone() for p in learner.backend.model.parameters()]
    claimed = learner.source.next_batch()
    assert claimed is not None
    original = learner.trainer.train_step
    _lose_the_claim_during_the_step(learner, store, claimed)
    assert learner.train(claimed) is None  # rolled back, not a CheckpointError: there is no version to return to
    assert learner.lost_claims == 1
    assert learner.backend.policy_version == 0
    for p, q in zip(learner.backend.model.parameters(), start, strict=True):
        assert torch.equal(p, q)  # the update on B's execution is gone
    learner.trainer.train_step = original  # type: ignore[method-assign]
    assert learner.step() is not None  # and it trains on: the other execution becomes version 1
    assert latest_policy(store, "train")[0] == 1  # type: ignore[index]
