"""Advantages: loop-vs-vectorized equivalence and the invariants of Skip-Obs / cross-trajectory GAE."""

from __future__ import annotations

import pytest
import torch

from sapwood.learner.advantages import (
    batch_gae,
    cross_trajectory_gae,
    skip_observation_gae,
    token_gae,
    tree_gae,
)
from sapwood.learner.batch import ACTION, OBSERVATION, PROMPT, SUMMARY, TreeBatch, TreeBatchBuilder
from sapwood.learner.config import AdvantageConfig
from tests.support import gae_reference as ref
from tests.support.random_trees import random_tree_batch

F64 = torch.float64
SETTINGS = [(1.0, 0.95), (0.97, 0.8), (1.0, 1.0)]


def close(a: torch.Tensor, b: list[float] | torch.Tensor, atol: float = 1e-5) -> bool:
    return torch.allclose(a.double(), torch.as_tensor(b, dtype=F64), atol=atol, rtol=1e-5)


def gae_of(batch: TreeBatch, values: torch.Tensor, gamma: float, lam: float, returns_lam: float | None = None):
    return tree_gae(
        batch.parent,
        batch.segment_parent,
        batch.trainable,
        batch.leaf_reward,
        values,
        gamma=gamma,
        lam=lam,
        returns_lam=returns_lam,
    )


def chain_batch(segments: list[list[tuple[int, int]]], reward: float, seed: int = 0) -> TreeBatch:
    """One logical trajectory: each segment a fresh context (prompt, then runs of (role, length))."""
    g = torch.Generator().manual_seed(seed)
    b = TreeBatchBuilder()
    e = b.add_execution("chain", "math")
    last_summary = -1
    for k, runs in enumerate(segments):
        node = b.add_run(e, -1, [1, 2], PROMPT, segment_parent=last_summary)
        for j, (role, n) in enumerate(runs):
            is_last = k == len(segments) - 1 and j == len(runs) - 1
            toks = torch.randint(0, 32, (n,), generator=g).tolist()
            lp = (-torch.rand(n, generator=g)).tolist()
            node = b.add_run(e, node, toks, role, logprobs=lp, reward=reward if is_last else None)
        last_summary = node
    batch = b.build()
    batch.validate()
    return batch


SEGMENTS = [
    [(ACTION, 3), (OBSERVATION, 2), (ACTION, 2), (SUMMARY, 2)],
    [(PROMPT, 2), (ACTION, 4), (OBSERVATION, 3), (ACTION, 1), (SUMMARY, 3)],
    [(PROMPT, 1), (ACTION, 2), (OBSERVATION, 1), (ACTION, 3)],
]


# ----------------------------------------------------------- loop vs vectorized
@pytest.mark.parametrize(("gamma", "lam"), SETTINGS)
def test_token_gae_matches_loop(gamma: float, lam: float) -> None:
    g = torch.Generator().manual_seed(0)
    r, v = torch.randn(40, generator=g), torch.randn(40, generator=g)
    dones = torch.rand(40, generator=g) < 0.15
    adv, ret = token_gae(r, v, gamma=gamma, lam=lam, dones=dones, bootstrap=0.7)
    want_a, want_r = ref.token_gae_loop(r.tolist(), v.tolist(), gamma, lam, dones.tolist(), 0.7)
    assert close(adv, want_a)
    assert close(ret, want_r)


@pytest.mark.parametrize(("gamma", "lam"), SETTINGS)
def test_skip_observation_gae_matches_loop(gamma: float, lam: float) -> None:
    g = torch.Generator().manual_seed(1)
    r, v = torch.randn(50, generator=g), torch.randn(50, generator=g)
    trainable = torch.rand(50, generator=g) < 0.6
    adv, ret = skip_observation_gae(r, v, trainable, gamma=gamma, lam=lam)
    want_a, want_r = ref.skip_observation_gae_loop(r.tolist(), v.tolist(), trainable.tolist(), gamma, lam)
    assert close(adv, want_a)
    assert close(ret, want_r)


@pytest.mark.parametrize(("gamma", "lam"), SETTINGS)
def test_cross_trajectory_gae_matches_loop(gamma: float, lam: float) -> None:
    g = torch.Generator().manual_seed(2)
    v = torch.randn(60, generator=g)
    trainable = torch.rand(60, generator=g) < 0.7
    segment = torch.sort(torch.randint(0, 4, (60,), generator=g)).values
    adv, ret = cross_trajectory_gae(v, trainable, segment, 0.8, gamma=gamma, lam=lam)
    want_a, want_r = ref.cross_trajectory_gae_loop(v.tolist(), trainable.tolist(), segment.tolist(), 0.8, gamma, lam)
    assert close(adv, want_a)
    assert close(ret, want_r)


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize(("gamma", "lam", "returns_lam"), [(1.0, 0.9, None), (0.97, 0.8, 1.0)])
def test_tree_gae_matches_loop(seed: int, gamma: float, lam: float, returns_lam: float | None) -> None:
    batch = random_tree_batch(seed, max_segments=4, jmax=5)
    values = torch.randn(batch.num_tokens, generator=torch.Generator().manual_seed(seed))
    got = gae_of(batch, values, gamma, lam, returns_lam)
    want = ref.tree_gae_loop(
        batch.parent, batch.segment_parent, batch.trainable, batch.leaf_reward, values, gamma, lam, returns_lam
    )
    for key, expected in want.items():
        assert close(getattr(got, key), expected), key


# -------------------------------------------------------------------- invariants
@pytest.mark.parametrize(("gamma", "lam"), SETTINGS)
def test_v_zero_cross_trajectory_equals_gae_over_concatenated_trajectory(gamma: float, lam: float) -> None:
    batch = chain_batch(SEGMENTS, reward=0.7)
    tr = batch.trainable
    n = int(tr.sum())
    zeros = torch.zeros(batch.num_tokens)
    rewards = torch.zeros(n)
    rewards[-1] = 0.7
    concat, _ = token_gae(rewards, torch.zeros(n), gamma=gamma, lam=lam)  # the logical trajectory
    segment = torch.unique(batch.segment_start(), return_inverse=True)[1]
    flat, _ = cross_trajectory_gae(zeros, tr, segment, 0.7, gamma=gamma, lam=lam)
    assert torch.allclose(flat[tr], concat, atol=1e-6)
    tree = gae_of(batch, zeros, gamma, lam)
    assert torch.allclose(tree.advantages[tr], concat, atol=1e-6)
    assert torch.equal(tree.advantages[~tr], torch.zeros(int((~tr).sum())))


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 0.9), (0.95, 0.7)])
def test_v_zero_tree_gae_equals_gae_over_the_whole_logical_tree(seed: int, gamma: float, lam: float) -> None:
    """Also with forks after compaction: a segment end contributes E[(γλ)^N R], not a product of means."""
    batch = random_tree_batch(seed, max_segments=4, jmax=5, fork_prob=0.5)
    zeros = torch.zeros(batch.num_tokens)
    got = gae_of(batch, zeros, gamma, lam).advantages
    want = ref.full_tree_gae_loop(
        batch.parent, batch.segment_parent, batch.trainable, batch.leaf_reward, zeros, gamma, lam
    )
    assert close(got, want, atol=1e-6)


@pytest.mark.parametrize(("gamma", "lam"), SETTINGS)
def test_tree_gae_on_a_chain_is_the_cross_trajectory_formula(gamma: float, lam: float) -> None:
    """Â = (γλ)^{N>s} A^loc with random values; returns are local λ-returns."""
    batch = chain_batch(SEGMENTS, reward=0.4, seed=3)
    values = torch.randn(batch.num_tokens, generator=torch.Generator().manual_seed(3))
    segment = torch.unique(batch.segment_start(), return_inverse=True)[1]
    adv, ret = cross_trajectory_gae(values, batch.trainable, segment, 0.4, gamma=gamma, lam=lam)
    got = gae_of(batch, values, gamma, lam)
    assert torch.allclose(got.advantages, adv, atol=1e-6)
    assert torch.allclose(got.returns, ret, atol=1e-6)
    assert torch.allclose(got.advantages, got.discount * got.local_advantages, atol=1e-6)
    n_s = torch.bincount(segment[batch.trainable]).tolist()  # trainable tokens per segment
    expected_m = [(gamma * lam) ** sum(n_s[s + 1 :]) for s in range(len(n_s))]
    assert close(got.discount[batch.trainable], [expected_m[s] for s in segment[batch.trainable].tolist()])


def test_single_segment_chain_is_skip_observation_gae_and_token_gae() -> None:
    batch = chain_batch([SEGMENTS[0][:3]], reward=1.3, seed=4)
    values = torch.randn(batch.num_tokens, generator=torch.Generator().manual_seed(4))
    rewards = torch.nan_to_num(batch.leaf_reward, nan=0.0)
    want_a, want_r = skip_observation_gae(rewards, values, batch.trainable, gamma=0.99, lam=0.9)
    got = gae_of(batch, values, 0.99, 0.9)
    assert torch.allclose(got.advantages, want_a, atol=1e-6)
    assert torch.allclose(got.returns, want_r, atol=1e-6)
    # One action: token-level GAE inside it (values of the following action's tokens are not used).
    action = chain_batch([[(ACTION, 5)]], reward=0.5, seed=5)
    tr = action.trainable
    v = torch.randn(action.num_tokens)
    r = torch.zeros(5)
    r[-1] = 0.5
    a, g = token_gae(r, v[tr], gamma=0.99, lam=0.9)
    got = gae_of(action, v, 0.99, 0.9)
    assert torch.allclose(got.advantages[tr], a, atol=1e-6)
    assert torch.allclose(got.returns[tr], g, atol=1e-6)


@pytest.mark.parametrize("seed", range(8))
def test_observation_values_never_change_an_advantage(seed: int) -> None:
    batch = random_tree_batch(seed, max_segments=3, jmax=5)
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(batch.num_tokens, generator=g)
    noisy = values.clone()
    not_trainable = ~batch.trainable
    noisy[not_trainable] = 100.0 * torch.randn(int(not_trainable.sum()), generator=g)
    a, b = gae_of(batch, values, 0.99, 0.9), gae_of(batch, noisy, 0.99, 0.9)
    for key in ("advantages", "returns", "local_advantages", "discount"):
        assert torch.equal(getattr(a, key), getattr(b, key)), key
    assert bool((batch.role[not_trainable] == OBSERVATION).any())  # the test really perturbed observations


def test_summary_tokens_get_the_final_reward() -> None:
    batch = chain_batch(SEGMENTS, reward=0.6)
    got = gae_of(batch, torch.zeros(batch.num_tokens), 1.0, 1.0)
    summary = batch.role == SUMMARY
    assert torch.allclose(got.advantages[summary], torch.full((int(summary.sum()),), 0.6))
    assert torch.allclose(got.advantages[batch.trainable], torch.full((int(batch.trainable.sum()),), 0.6))


def forked_execution(rewards: list[float], prefix_len: int = 3, branch_len: int = 2) -> TreeBatch:
    """prompt, action (prefix), observation, then one action branch per reward."""
    b = TreeBatchBuilder()
    e = b.add_execution("fork", "math")
    p = b.add_run(e, -1, [1, 2], PROMPT)
    a = b.add_run(e, p, list(range(3, 3 + prefix_len)), ACTION, logprobs=[-0.5] * prefix_len)
    o = b.add_run(e, a, [9], OBSERVATION)
    for k, r in enumerate(rewards):
        b.add_run(e, o, [10 + k] * branch_len, ACTION, logprobs=[-0.5] * branch_len, reward=r)
    batch = b.build()
    batch.validate()
    return batch


def depth_values(batch: TreeBatch) -> torch.Tensor:
    """Values that depend only on the position (so every branch sees the same values)."""
    return torch.sin(batch.position.to(torch.float32))


def test_ten_way_fork_gives_the_prefix_one_trajectorys_credit() -> None:
    prefix = slice(2, 5)
    single = forked_execution([1.0])
    ten = forked_execution([1.0] * 10)
    a1 = gae_of(single, depth_values(single), 0.99, 0.9).advantages
    a10 = gae_of(ten, depth_values(ten), 0.99, 0.9).advantages
    assert torch.allclose(a10[prefix], a1[prefix], atol=1e-6)
    # Different branch rewards: the prefix gets the mean over its children.
    rewards = [0.1 * k for k in range(10)]
    mixed = forked_execution(rewards)
    a_mixed = gae_of(mixed, depth_values(mixed), 0.99, 0.9).advantages
    per_branch = torch.stack(
        [gae_of(b, depth_values(b), 0.99, 0.9).advantages[prefix] for b in (forked_execution([r]) for r in rewards)]
    )
    assert torch.allclose(a_mixed[prefix], per_branch.mean(0), atol=1e-6)


def test_batch_gae_uses_the_config() -> None:
    batch = random_tree_batch(0)
    v = torch.randn(batch.num_tokens)
    cfg = AdvantageConfig(gamma=0.98, lam=0.9, returns_lam=None)
    got = batch_gae(batch, v, cfg)
    want = gae_of(batch, v, 0.98, 0.9, 0.9)
    assert torch.equal(got.advantages, want.advantages)
    assert torch.equal(got.returns, want.returns)


def test_fork_after_compaction_discounts_each_branch_by_its_own_length() -> None:
    """Summary, then the next segment forks: a long branch (R=1) and a short one (R=0)."""
    b = TreeBatchBuilder()
    e = b.add_execution("x", "swe")
    p = b.add_run(e, -1, [1], PROMPT)
    s = b.add_run(e, p, [2, 3], SUMMARY, logprobs=[-1.0, -1.0])
    root = b.add_run(e, -1, [4], PROMPT, segment_parent=s)
    b.add_run(e, root, [5] * 10, ACTION, logprobs=[-1.0] * 10, reward=1.0)
    b.add_run(e, root, [6] * 2, ACTION, logprobs=[-1.0] * 2, reward=0.0)
    batch = b.build()
    batch.validate()
    gl = 0.9
    got = gae_of(batch, torch.zeros(batch.num_tokens), 1.0, gl)
    # Whole-tree GAE: last summary token sees 0.5 * (γλ)^10 * 1 + 0.5 * (γλ)^2 * 0.
    assert got.advantages[s].item() == pytest.approx(0.5 * gl**10)
    assert got.discount[s].item() == pytest.approx(0.5 * (gl**10 + gl**2))
