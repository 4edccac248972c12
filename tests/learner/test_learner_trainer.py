"""SAOTrainer: critic warm-up, catch-up, joint DIS + value steps, metrics."""

from __future__ import annotations

import pytest
import torch

from sapwood.learner.batch import PROMPT, TreeBatchBuilder
from sapwood.learner.config import CriticConfig, LearnerConfig, OptimConfig, PolicyLossConfig
from sapwood.learner.errors import BatchValidationError
from sapwood.learner.model import TinyActorCritic, TinyTransformerConfig, TorchBackend
from sapwood.learner.trainer import SAOTrainer
from tests.support.random_trees import random_tree_batch

VOCAB = 32


def make_trainer(config: LearnerConfig, seed: int = 0) -> tuple[SAOTrainer, TinyActorCritic]:
    torch.manual_seed(seed)
    model = TinyActorCritic(TinyTransformerConfig(vocab_size=VOCAB, d_model=32, n_heads=4, n_layers=1, d_ff=64))
    backend = TorchBackend.from_config(model, config)
    return SAOTrainer(backend, config), model


def actor_params(model: TinyActorCritic) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.actor_parameters()]


def unchanged(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_critic_warms_up_before_the_first_policy_update() -> None:
    cfg = LearnerConfig(critic=CriticConfig(warmup_steps=2, catchup_max_steps=0))
    trainer, model = make_trainer(cfg)
    batch = random_tree_batch(0, vocab_size=VOCAB)
    before = actor_params(model)
    for _ in range(2):
        m = trainer.train_step(batch)
        assert m["train/critic_warmup"] == 1.0
        assert "policy/loss" not in m
        assert unchanged(before, actor_params(model))
        assert trainer.backend.policy_version == 0
    m = trainer.train_step(batch)
    assert m["train/critic_warmup"] == 0.0
    assert "policy/loss" in m
    assert not unchanged(before, actor_params(model))
    assert trainer.backend.policy_version == 1


def test_replayed_history_counts_as_warmup() -> None:
    cfg = LearnerConfig(critic=CriticConfig(warmup_steps=2, catchup_max_steps=0))
    trainer, _ = make_trainer(cfg)
    history = [random_tree_batch(s, vocab_size=VOCAB) for s in (1, 2)]
    metrics = trainer.warmup_critic(history)
    assert len(metrics) == 2
    assert trainer.backend.policy_version == 0
    m = trainer.train_step(random_tree_batch(3, vocab_size=VOCAB))
    assert m["train/critic_warmup"] == 0.0
    assert trainer.backend.policy_version == 1


def test_catch_up_runs_extra_critic_steps_while_the_critic_lags() -> None:
    # An explained-variance floor above 1 can never be met: every step lags, catch-up runs to its cap.
    cfg = LearnerConfig(critic=CriticConfig(warmup_steps=0, catchup_max_steps=3, catchup_min_explained_var=1.5))
    trainer, _ = make_trainer(cfg)
    batch = random_tree_batch(4, vocab_size=VOCAB, num_executions=4)
    m = trainer.train_step(batch)
    assert m["train/catchup_steps"] == 3.0
    assert "critic/value_loss_after_catchup" in m
    assert trainer.backend.policy_version == 1  # catch-up steps never move the policy
    # Off: no criterion, no extra steps.
    off = LearnerConfig(critic=CriticConfig(warmup_steps=0, catchup_loss_ratio=None, catchup_min_explained_var=None))
    trainer, _ = make_trainer(off)
    assert trainer.train_step(batch)["train/catchup_steps"] == 0.0


def test_catch_up_on_a_value_loss_spike() -> None:
    cfg = LearnerConfig(
        critic=CriticConfig(warmup_steps=0, catchup_max_steps=1, catchup_loss_ratio=1.5, catchup_min_explained_var=None)
    )
    trainer, _ = make_trainer(cfg)
    trainer.value_loss_ema = 1e-9  # the running average says the critic was nearly perfect
    m = trainer.train_step(random_tree_batch(5, vocab_size=VOCAB))
    assert m["train/catchup_steps"] == 1.0


def test_metrics_are_namespaced_and_finite() -> None:
    cfg = LearnerConfig(critic=CriticConfig(warmup_steps=0))
    trainer, _ = make_trainer(cfg)
    batch = random_tree_batch(6, vocab_size=VOCAB)
    m = trainer.train_step(batch)
    expected = {
        "policy/loss",
        "policy/masked_frac",
        "policy/ratio_mean",
        "policy/staleness_mean",
        "policy/staleness_max",
        "critic/value_loss",
        "critic/explained_var",
        "actor/grad_norm",
        "critic/grad_norm",
        "adv/mean",
        "train/catchup_steps",
    }
    assert expected <= m.keys()
    # |M| is the sum of path weights over the trainable tokens, below their count (this batch forks).
    assert m["train/trainable_weight"] == pytest.approx(float(batch.execution_weight().sum()))
    assert m["train/trainable_weight"] < m["train/trainable_tokens"]
    assert all("/" in k for k in m)
    assert all(v == v for k, v in m.items() if k != "critic/explained_var")  # no NaN


@pytest.mark.parametrize(("kind", "aggregation"), [("ppo", "token"), ("dis", "segment_mean")])
def test_other_objectives_run(kind: str, aggregation: str) -> None:
    cfg = LearnerConfig(
        policy=PolicyLossConfig(kind=kind, aggregation=aggregation),  # type: ignore[arg-type]
        critic=CriticConfig(warmup_steps=0),
    )
    trainer, _ = make_trainer(cfg)
    m = trainer.train_step(random_tree_batch(7, vocab_size=VOCAB))
    assert trainer.backend.policy_version == 1
    assert "policy/loss" in m


def test_ppo_with_recomputed_old_logprobs_starts_at_ratio_one() -> None:
    cfg = LearnerConfig(
        policy=PolicyLossConfig(kind="ppo", ppo_old_logprob="recompute"), critic=CriticConfig(warmup_steps=0)
    )
    trainer, _ = make_trainer(cfg)
    m = trainer.train_step(random_tree_batch(10, vocab_size=VOCAB))
    assert m["policy/ratio_mean"] == pytest.approx(1.0)
    assert m["policy/clip_frac"] == 0.0


def test_a_batch_without_trainable_tokens_is_skipped() -> None:
    b = TreeBatchBuilder()
    e = b.add_execution("prompt-only", "math")
    b.add_run(e, -1, [1, 2], PROMPT, reward=0.0)
    trainer, _ = make_trainer(LearnerConfig(critic=CriticConfig(warmup_steps=0)))
    m = trainer.train_step(b.build())
    assert m["train/skipped_empty"] == 1.0
    assert trainer.backend.policy_version == 0


def test_jmax_is_enforced() -> None:
    trainer, _ = make_trainer(LearnerConfig(jmax=1))
    batch = next(
        b
        for b in (random_tree_batch(s, vocab_size=VOCAB, fork_prob=0.9) for s in range(50))
        if int(b.trajectories_per_execution().max()) > 1
    )
    with pytest.raises(BatchValidationError, match="Jmax is 1"):
        trainer.train_step(batch)


def test_the_critic_learns_a_fixed_batch() -> None:
    cfg = LearnerConfig(critic=CriticConfig(warmup_steps=100, value_clip=None), optim=OptimConfig(critic_lr=3e-3))
    trainer, _ = make_trainer(cfg)
    batch = random_tree_batch(8, vocab_size=VOCAB, num_executions=4)
    first = trainer.train_step(batch)["critic/value_loss"]
    for _ in range(25):
        last = trainer.train_step(batch)["critic/value_loss"]
    assert last < 0.5 * first


def test_dis_step_moves_logprobs_along_the_advantage() -> None:
    """One small DIS step raises Σ Â·logπ over the kept tokens (first-order ascent)."""
    cfg = LearnerConfig(critic=CriticConfig(warmup_steps=0, catchup_max_steps=0), optim=OptimConfig(actor_lr=1e-3))
    trainer, _ = make_trainer(cfg)
    batch = random_tree_batch(9, vocab_size=VOCAB, num_executions=4)
    before = trainer.backend.forward(batch).logprob
    batch.rollout_logprob = torch.where(batch.trainable, before, 0.0)  # on-policy: every ratio is 1
    targets, _ = trainer.prepare(batch)
    trainer.train_step(batch)
    after = trainer.backend.forward(batch).logprob
    tr = batch.trainable
    gain = float((targets.advantages[tr] * (after - before)[tr]).sum())
    assert gain > 0
