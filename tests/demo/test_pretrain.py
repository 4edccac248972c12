"""Supervised warm start: demonstrations, packing, the two phases."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sapwood.demo.pretrain import PretrainConfig, demonstration, pack_sequences, pretrain
from sapwood.demo.tasks import SUM_END, SUM_REQ, DemoNoise, KeyRecallEnv
from sapwood.learner.model import TinyActorCritic, TinyTransformerConfig
from sapwood.platform.errors import ValidationError


def test_demonstrations_supervise_exactly_the_model_outputs() -> None:
    env = KeyRecallEnv()
    c = env.config
    rng = np.random.default_rng(0)
    for _ in range(20):
        seqs = demonstration(env, DemoNoise(), rng)
        for tokens, mask in seqs:
            assert len(tokens) == len(mask) <= c.context_limit
            supervised = [t for t, m in zip(tokens, mask, strict=True) if m]
            if SUM_REQ in tokens:  # a summary: everything after the request, ending with SUM_END
                req = tokens.index(SUM_REQ)
                assert all(mask[req + 1 :])
                assert tokens[-1] == SUM_END
            assert supervised
            assert not any(mask[: c.max_key + 4])  # the prompt is never supervised
        assert len(seqs) == 1 + sum(SUM_REQ in t for t, _ in seqs)


def test_packing_keeps_sequences_apart() -> None:
    tokens, position, attn, target, loss_mask = pack_sequences([([1, 2, 3], [False, True, True]),
                                                                ([4, 5], [False, True])])
    assert tokens.tolist() == [1, 2, 3, 4, 5]
    assert position.tolist() == [0, 1, 2, 0, 1]
    assert target.tolist() == [2, 3, 0, 5, 0]
    assert loss_mask.tolist() == [True, True, False, True, False]
    expected = torch.tensor([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [0, 0, 0, 1, 0], [0, 0, 0, 1, 1]],
                            dtype=torch.bool)
    assert torch.equal(attn, expected)


def test_two_phases_and_a_lower_loss() -> None:
    env = KeyRecallEnv()
    cfg = TinyTransformerConfig(vocab_size=env.config.vocab_size, d_model=32, n_heads=4, n_layers=1, d_ff=64,
                                max_position=env.config.context_limit)
    torch.manual_seed(0)
    model = TinyActorCritic(cfg)
    critic_before = [p.detach().clone() for p in model.critic_parameters()]
    seen: list[tuple[int, int]] = []
    result = pretrain(model, env, PretrainConfig(max_clean_steps=12, min_clean_steps=0, noisy_steps=3, batch_size=4),
                      on_step=lambda step, loss, planned: seen.append((step, planned)))
    assert result.clean_steps == 12
    assert not result.converged
    assert len(result.losses) == 15
    assert seen[0] == (0, 15)
    assert seen[-1] == (14, 15)
    assert min(result.losses[:12]) < result.losses[0]
    for before, after in zip(critic_before, model.critic_parameters(), strict=True):
        assert torch.equal(before, after)  # only the actor is pre-trained
    assert not model.training


def test_config_is_validated() -> None:
    with pytest.raises(ValidationError):
        PretrainConfig(max_clean_steps=10, min_clean_steps=20)
