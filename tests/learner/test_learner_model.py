"""Model and backend: the tree-packed forward equals the flattened per-trajectory computation."""

from __future__ import annotations

import pytest
import torch

from sapwood.learner.advantages import batch_gae
from sapwood.learner.batch import TreeBatch
from sapwood.learner.config import LearnerConfig, OptimConfig, PolicyLossConfig
from sapwood.learner.errors import ConfigError
from sapwood.learner.flat import flatten
from sapwood.learner.model import (
    PolicyBackend,
    TinyActorCritic,
    TinyTransformerConfig,
    TorchBackend,
    flat_forward,
    tree_forward,
)
from sapwood.learner.trainer import LossTargets, compute_losses
from tests.support.random_trees import random_tree_batch

VOCAB = 32


def tiny(seed: int = 0, shared: bool = False, dtype: torch.dtype = torch.float64) -> TinyActorCritic:
    torch.manual_seed(seed)
    cfg = TinyTransformerConfig(vocab_size=VOCAB, d_model=32, n_heads=4, n_layers=2, d_ff=64, shared_trunk=shared)
    return TinyActorCritic(cfg).to(dtype)


def near_policy_batch(model: TinyActorCritic, seed: int) -> TreeBatch:
    """A random tree whose rollout log-probs are the model's plus noise: some ratios in, some out of the window."""
    batch = random_tree_batch(seed, jmax=4, max_segments=3, vocab_size=VOCAB)
    with torch.no_grad():
        lp = tree_forward(model, batch).logprob.float()
    noise = 0.6 * torch.randn(batch.num_tokens, generator=torch.Generator().manual_seed(seed))
    batch.rollout_logprob = torch.where(batch.trainable, (lp + noise).clamp(max=0.0), 0.0)
    batch.validate()
    return batch


def grads(model: TinyActorCritic) -> list[torch.Tensor]:
    return [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize(("kind", "aggregation"), [("dis", "token"), ("dis", "segment_mean"), ("ppo", "token")])
def test_tree_packed_equals_flattened_losses_and_gradients(seed: int, kind: str, aggregation: str) -> None:
    model = tiny(seed)
    batch = near_policy_batch(model, seed)
    cfg = LearnerConfig(policy=PolicyLossConfig(kind=kind, aggregation=aggregation))  # type: ignore[arg-type]
    with torch.no_grad():
        old = tree_forward(model, batch)
    targets = LossTargets.build(batch, batch_gae(batch, old.values, cfg.advantage), old, cfg.policy)

    model.zero_grad()
    tree_out = tree_forward(model, batch)
    tree_loss, tree_metrics = compute_losses(tree_out, targets, cfg)
    tree_loss.backward()
    tree_grads = grads(model)

    flat = flatten(batch)
    idx, w = flat.cat_index(), flat.cat_weight()
    model.zero_grad()
    flat_out = flat_forward(model, batch, flat)
    flat_loss, flat_metrics = compute_losses(flat_out, targets.select(idx, w.double()), cfg)
    flat_loss.backward()

    assert torch.allclose(flat_out.logprob, tree_out.logprob[idx].detach(), atol=1e-10)
    assert torch.allclose(flat_out.values, tree_out.values[idx].detach(), atol=1e-10)
    assert torch.allclose(tree_loss, flat_loss, atol=1e-10)
    for a, b in zip(tree_grads, grads(model), strict=True):
        assert torch.allclose(a, b, atol=1e-9)
    if kind == "dis":  # the window really dropped some tokens and kept others
        assert 0.0 < tree_metrics["policy/masked_frac"] < 1.0
    assert float(tree_metrics["policy/ratio_mean"]) == pytest.approx(float(flat_metrics["policy/ratio_mean"]))
    assert any(p.abs().sum() > 0 for p in tree_grads)


def test_shared_prefix_is_computed_once() -> None:
    batch = random_tree_batch(5, jmax=4)
    flat = flatten(batch)
    assert flat.cat_index().numel() > batch.num_tokens  # the flattened baseline recomputes shared prefixes


def test_forward_shapes_and_root_convention() -> None:
    model = tiny(dtype=torch.float32)
    batch = random_tree_batch(0, vocab_size=VOCAB)
    logits, values = model(batch.tokens, batch.position, batch.attention_mask())
    assert logits.shape == (batch.num_tokens, VOCAB)
    assert values.shape == (batch.num_tokens,)
    out = tree_forward(model, batch)
    roots = batch.parent < 0
    assert torch.equal(out.logprob[roots], torch.zeros(int(roots.sum())))
    assert bool((out.logprob[~roots] < 0).all())
    assert bool((out.entropy[~roots] > 0).all())
    # Token i is scored by the output at its parent.
    i = int((~roots).nonzero()[3, 0])
    p = int(batch.parent[i])
    expected = torch.log_softmax(logits[p], -1)[batch.tokens[i]]
    assert out.logprob[i].item() == pytest.approx(expected.item(), abs=1e-6)
    assert out.values[i].item() == pytest.approx(values[p].item(), abs=1e-6)


def test_position_limit_is_checked() -> None:
    model = tiny(dtype=torch.float32)
    with pytest.raises(ConfigError, match="max_position"):
        model(torch.zeros(1, dtype=torch.int64), torch.tensor([5000]), torch.ones(1, 1, dtype=torch.bool))
    with pytest.raises(ConfigError, match="divide"):
        TinyTransformerConfig(d_model=30, n_heads=4)


def actor_snapshot(model: TinyActorCritic) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.actor_parameters()]


def critic_snapshot(model: TinyActorCritic) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.critic_parameters()]


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("shared", [False, True])
def test_backend_steps_only_the_selected_groups(shared: bool) -> None:
    model = tiny(shared=shared, dtype=torch.float32)
    backend = TorchBackend(model, OptimConfig(actor_lr=1e-3, critic_lr=1e-3))
    assert isinstance(backend, PolicyBackend)
    batch = near_policy_batch(model.double(), 0)
    model.float()
    cfg = LearnerConfig()
    old = backend.forward(batch)
    targets = LossTargets.build(batch, batch_gae(batch, old.values, cfg.advantage), old, cfg.policy)
    a0, c0 = actor_snapshot(model), critic_snapshot(model)
    m = backend.step(
        batch, lambda o: compute_losses(o, targets, cfg, policy=False), update_actor=False, update_critic=True
    )
    assert same(a0, actor_snapshot(model))
    assert not same(c0, critic_snapshot(model))
    assert backend.policy_version == 0
    assert m["critic/grad_norm"] > 0
    a1 = actor_snapshot(model)
    m = backend.step(batch, lambda o: compute_losses(o, targets, cfg), update_actor=True, update_critic=True)
    assert not same(a1, actor_snapshot(model))
    assert backend.policy_version == 1
    assert m["actor/grad_norm"] > 0


def test_backend_state_dict_round_trip() -> None:
    model = tiny(dtype=torch.float32)
    backend = TorchBackend(model)
    batch = random_tree_batch(1, vocab_size=VOCAB)
    cfg = LearnerConfig()
    old = backend.forward(batch)
    targets = LossTargets.build(batch, batch_gae(batch, old.values, cfg.advantage), old, cfg.policy)
    backend.step(batch, lambda o: compute_losses(o, targets, cfg), update_actor=True, update_critic=True)
    state = backend.state_dict()
    other = TorchBackend(tiny(seed=9, dtype=torch.float32))
    other.load_state_dict(state)
    assert other.policy_version == 1
    assert torch.equal(other.forward(batch).logprob, backend.forward(batch).logprob)
