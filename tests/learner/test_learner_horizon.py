"""Horizon-aware lambda: the default derives from an effective horizon; the credit table matches tree GAE."""

from __future__ import annotations

import math

import pytest
import torch

from sapwood.learner.advantages import batch_gae
from sapwood.learner.batch import ACTION, PROMPT, SUMMARY, TreeBatchBuilder
from sapwood.learner.config import AdvantageConfig
from sapwood.learner.errors import ConfigError
from sapwood.learner.horizon import DEFAULT_HORIZON_TOKENS, credit_table, lam_for_horizon, segment_credit


def test_default_lambda_is_one_minus_one_over_the_horizon_and_an_explicit_lambda_wins() -> None:
    assert AdvantageConfig().effective_lam == pytest.approx(1 - 1 / DEFAULT_HORIZON_TOKENS)
    assert AdvantageConfig(horizon_tokens=500).effective_lam == pytest.approx(0.998)
    assert AdvantageConfig(lam=0.95, horizon_tokens=500).effective_lam == 0.95
    with pytest.raises(ConfigError, match="horizon_tokens"):
        AdvantageConfig(horizon_tokens=0.5)
    with pytest.raises(ConfigError, match="lam"):
        AdvantageConfig(lam=1.5)


def test_credit_after_h_tokens_is_about_one_over_e() -> None:
    lam = lam_for_horizon(10_000)
    assert segment_credit(20_000, 2, lam=lam) == pytest.approx([math.exp(-1), 1.0], rel=1e-4)


def test_segment_credit_is_what_tree_gae_applies_on_a_chain_of_segments() -> None:
    """Three segments of 7, 5 and 6 trainable tokens: GAE's discount m per segment equals segment_credit."""
    sizes = [7, 5, 6]
    b = TreeBatchBuilder()
    e = b.add_execution("chain", "math")
    node = -1
    for k, n in enumerate(sizes):
        root = b.add_run(e, -1, [1], PROMPT, segment_parent=node if k else -1)
        node = b.add_run(e, root, [2] * (n - 2), ACTION, logprobs=[-1.0] * (n - 2))
        node = b.add_run(e, node, [3, 3], SUMMARY, logprobs=[-1.0] * 2)
    b.set_reward(node, 1.0)
    batch = b.build()
    batch.validate()
    cfg = AdvantageConfig(horizon_tokens=12.0)
    gae = batch_gae(batch, torch.zeros(batch.num_tokens), cfg)
    seg = batch.segment_start()
    got = [float(gae.discount[(seg == s) & batch.trainable].unique().item()) for s in seg.unique().tolist()]
    expected = [cfg.effective_lam ** sum(sizes[k + 1 :]) for k in range(3)]
    assert got == pytest.approx(expected, rel=1e-6)
    assert segment_credit(sum(sizes), 3, lam=cfg.effective_lam) != pytest.approx(expected)  # unequal sizes
    lam = cfg.effective_lam
    assert segment_credit(18, 3, lam=lam) == pytest.approx([lam**12, lam**6, 1])


def test_the_readme_table_rows() -> None:
    table = credit_table().splitlines()
    assert len(table) == 2 + 3 * 3
    row = next(r for r in table if r.startswith("| 700,000 | 1 − 1/H, H = 100,000"))
    assert row.split("|")[3].strip() == f"{math.exp(-466_667 / 100_000):.3f}"  # 0.009
