"""Path-probability token weights: an execution's loss weight does not grow with its forks or with Jmax."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from sapwood.learner.advantages import batch_gae
from sapwood.learner.assembly import build_batch
from sapwood.learner.batch import ACTION, OBSERVATION, PROMPT, SUMMARY, TreeBatch, TreeBatchBuilder
from sapwood.learner.config import LearnerConfig, PolicyLossConfig, SourceConfig
from sapwood.learner.errors import BatchValidationError
from sapwood.learner.flat import flatten
from sapwood.learner.losses import dis_policy_loss, value_loss
from sapwood.learner.model import TinyActorCritic, TinyTransformerConfig, flat_forward, tree_forward
from sapwood.learner.trainer import LossTargets, compute_losses
from sapwood.platform.store import Store
from sapwood.platform.writer import ExecutionWriter
from tests.support.random_trees import random_tree_batch

VOCAB = 100


def _execution(ways: int) -> ExecutionWriter:
    """30 prompt tokens, a 9-token action, a 5-token observation, then ``ways`` 6-token actions (1: no fork)."""
    rng = np.random.default_rng(ways)
    w = ExecutionWriter(run_id="weights", task_id="t", vocab_size=VOCAB)
    w.start()
    root = w.prompt(rng.integers(0, VOCAB, 30)).node_id
    first = w.call(root, [1], rng.integers(0, VOCAB, 9), -rng.random(9))
    obs = w.observe(first.output_node_id, rng.integers(0, VOCAB, 5)).node_id
    if ways > 1:
        w.fork(obs, ways)
    for _ in range(ways):
        w.call(obs, [2], rng.integers(0, VOCAB, 6), -rng.random(6))
    w.finish("success", reward=1.0)
    return w


@pytest.fixture(scope="module")
def fork_and_chain(tmp_path_factory: pytest.TempPathFactory) -> tuple[Store, list[str]]:
    store = Store.open(f"sqlite:///{Path(tmp_path_factory.mktemp('weights')) / 's.db'}")
    fork, chain = _execution(10), _execution(1)
    store.apply(fork.events + chain.events)
    return store, [fork.execution_id, chain.execution_id]


def _abs_logprob_grad_per_execution(batch: TreeBatch, weight: torch.Tensor | None) -> torch.Tensor:
    """Σ|∂L/∂log π| over each execution's tokens, DIS at ratio 1 with advantage 1 everywhere."""
    lp = batch.rollout_logprob.double().clone().requires_grad_(True)
    adv = torch.ones(batch.num_tokens, dtype=torch.float64)
    loss, _ = dis_policy_loss(lp, batch.rollout_logprob.double(), adv, batch.trainable, 0.3, 5.0, weight=weight)
    loss.backward()
    assert lp.grad is not None
    return torch.zeros(batch.num_executions, dtype=torch.float64).index_add_(0, batch.execution, lp.grad.abs())


@pytest.mark.parametrize("jmax", [1, 2, 4, 8, 16])
def test_a_10_way_fork_weighs_as_much_as_a_chain_of_the_same_shape_whatever_jmax(
    fork_and_chain: tuple[Store, list[str]], jmax: int
) -> None:
    store, ids = fork_and_chain
    batch, used = build_batch(store, ids, SourceConfig(jmax=jmax))
    assert used == ids
    batch.validate(jmax=jmax)
    kept = min(jmax, 10)
    assert batch.trajectories_per_execution().tolist() == [kept, 1]
    assert int(batch.trainable[batch.execution == 0].sum()) == 9 + 6 * kept
    # 9 shared tokens at weight 1, then `kept` branches of 6 tokens at 1/kept: 15 = one trajectory's length.
    assert batch.execution_weight().tolist() == pytest.approx([15.0, 15.0], abs=1e-12)
    grad = _abs_logprob_grad_per_execution(batch, batch.token_weight())
    assert grad.tolist() == pytest.approx([0.5, 0.5], abs=1e-12)
    # The unit weights this replaces: the forking execution pulled (9 + 6 kept) / 15 times the chain's gradient.
    unit = _abs_logprob_grad_per_execution(batch, None)
    assert float(unit[0] / unit[1]) == pytest.approx((9 + 6 * kept) / 15)


def test_the_critic_loss_is_weighted_the_same_way(fork_and_chain: tuple[Store, list[str]]) -> None:
    store, ids = fork_and_chain
    batch, _ = build_batch(store, ids, SourceConfig(jmax=8))
    values = torch.zeros(batch.num_tokens, dtype=torch.float64, requires_grad=True)
    returns = torch.ones(batch.num_tokens, dtype=torch.float64)  # the same error on every token
    loss, _ = value_loss(values, values.detach(), returns, batch.trainable, clip=None, weight=batch.token_weight())
    loss.backward()
    assert values.grad is not None
    per_exec = torch.zeros(2, dtype=torch.float64).index_add_(0, batch.execution, values.grad.abs())
    assert per_exec.tolist() == pytest.approx([0.5, 0.5], abs=1e-12)


def _expected_trajectory_length(batch: TreeBatch, execution: int) -> float:
    """Mean over leaves, each drawn with its uniform-at-forks probability, of its trainable length (a loop)."""
    lp = batch.logical_parent().tolist()
    children: dict[int, int] = {}
    for p in lp:
        if p >= 0:
            children[p] = children.get(p, 0) + 1
    total = 0.0
    for leaf in batch.is_leaf().nonzero().squeeze(1).tolist():
        if int(batch.execution[leaf]) != execution:
            continue
        prob, length, x = 1.0, 0, leaf
        while x >= 0:
            length += int(batch.trainable[x])
            if lp[x] >= 0:
                prob /= children[lp[x]]
            x = lp[x]
        total += prob * length
    return total


def nested_forks() -> TreeBatch:
    """prompt, 2 action tokens, fork 2 ways: (2 tokens, obs, fork 3 ways of 1 token) | (4 tokens)."""
    b = TreeBatchBuilder()
    e = b.add_execution("nested", "math")
    p = b.add_run(e, -1, [1, 2], PROMPT)
    a = b.add_run(e, p, [3, 4], ACTION, logprobs=[-0.5] * 2)
    left = b.add_run(e, a, [5, 6], ACTION, logprobs=[-0.5] * 2)
    o = b.add_run(e, left, [7], OBSERVATION)
    for k in range(3):
        b.add_run(e, o, [8 + k], ACTION, logprobs=[-0.5], reward=float(k))
    b.add_run(e, a, [11, 12, 13, 14], ACTION, logprobs=[-0.5] * 4, reward=1.0)
    batch = b.build()
    batch.validate()
    return batch


def fork_after_compaction(shared_prompt: bool) -> TreeBatch:
    """Segment 0 (prompt, 3 actions, 2-token summary), then two continuations of that summary:
    new segments in fresh contexts, or after the prompt shared with segment 0; one of them forks again."""
    b = TreeBatchBuilder()
    e = b.add_execution("compacted", "swe")
    p = b.add_run(e, -1, [1, 2], PROMPT)
    a = b.add_run(e, p, [3, 4, 5], ACTION, logprobs=[-0.4] * 3)
    s = b.add_run(e, a, [6, 7], SUMMARY, logprobs=[-0.3] * 2)
    for k in range(2):
        if shared_prompt:
            start = b.add_run(e, p, [20 + k], PROMPT, segment_parent=s)
        else:
            start = b.add_run(e, b.add_run(e, -1, [1], PROMPT, segment_parent=s), [20 + k], PROMPT)
        act = b.add_run(e, start, [30 + k, 31], ACTION, logprobs=[-0.6] * 2)
        if k == 0:
            for j in range(2):
                b.add_run(e, act, [40 + j], ACTION, logprobs=[-0.2], reward=0.5 * j)
        else:
            b.set_reward(act, 1.0)
    batch = b.build()
    batch.validate()
    return batch


def test_nested_forks_multiply_their_degrees() -> None:
    batch = nested_forks()
    w = batch.token_weight()
    by_token = {int(t): float(x) for t, x in zip(batch.tokens, w, strict=True)}
    assert [by_token[t] for t in (1, 2, 3, 4)] == [1.0] * 4  # shared prefix
    assert [by_token[t] for t in (5, 6, 7, 11, 12, 13, 14)] == pytest.approx([0.5] * 7)  # below one 2-way fork
    assert [by_token[t] for t in (8, 9, 10)] == pytest.approx([1 / 6] * 3)  # below a 2-way then a 3-way fork
    assert float(batch.execution_weight()[0]) == pytest.approx(5.5)
    assert float(batch.execution_weight()[0]) == pytest.approx(_expected_trajectory_length(batch, 0))


@pytest.mark.parametrize("shared_prompt", [False, True])
def test_a_fork_right_after_a_compaction(shared_prompt: bool) -> None:
    batch = fork_after_compaction(shared_prompt)
    w = batch.token_weight()
    seg0 = batch.segment_start() == 0
    assert torch.equal(w[seg0], torch.ones(int(seg0.sum()), dtype=torch.float64))  # the prompt shared or not
    first = {int(t): float(x) for t, x in zip(batch.tokens, w, strict=True)}
    assert [first[t] for t in (20, 30, 21, 31)] == pytest.approx([0.5] * 4)  # the summary's 2 continuations
    assert [first[t] for t in (40, 41)] == pytest.approx([0.25] * 2)
    assert float(batch.execution_weight()[0]) == pytest.approx(_expected_trajectory_length(batch, 0))
    # The prompt shared by the segments is one logical path, not a fork: 3 trajectories, not 4.
    assert int(batch.trajectories_per_execution()[0]) == 3


@pytest.mark.parametrize("seed", range(12))
def test_every_executions_weight_is_its_expected_trajectory_length_on_random_trees(seed: int) -> None:
    batch = random_tree_batch(seed, jmax=4, fork_prob=0.6)
    got = batch.execution_weight()
    for e in range(batch.num_executions):
        assert float(got[e]) == pytest.approx(_expected_trajectory_length(batch, e), abs=1e-12)


def test_several_logical_roots_share_the_executions_weight() -> None:
    b = TreeBatchBuilder()
    e = b.add_execution("two-roots", "math")
    for k in range(2):
        p = b.add_run(e, -1, [1 + k], PROMPT)
        b.add_run(e, p, [3, 4, 5], ACTION, logprobs=[-0.5] * 3, reward=1.0)
    batch = b.build()
    assert float(batch.execution_weight()[0]) == pytest.approx(3.0)


def test_an_explicit_weight_overrides_the_path_probability_and_is_validated() -> None:
    batch = nested_forks()
    batch.weight = torch.ones(batch.num_tokens)
    batch.validate()
    assert torch.equal(batch.token_weight(), torch.ones(batch.num_tokens))
    batch.weight = torch.full((batch.num_tokens,), float("nan"))
    with pytest.raises(BatchValidationError, match="finite"):
        batch.validate()
    batch.weight = torch.ones(3)
    with pytest.raises(BatchValidationError, match="shape"):
        batch.validate()


TREES = {
    "nested": nested_forks,
    "compaction-fresh": lambda: fork_after_compaction(False),
    "compaction-shared": lambda: fork_after_compaction(True),
}


@pytest.mark.parametrize("tree", sorted(TREES))
@pytest.mark.parametrize("weighting", ["path", "unit"])
def test_tree_packed_equals_flattened_on_these_trees(tree: str, weighting: str) -> None:
    torch.manual_seed(0)
    model = TinyActorCritic(TinyTransformerConfig(vocab_size=64, d_model=16, n_heads=2, n_layers=1, d_ff=32)).double()
    batch = TREES[tree]()
    cfg = LearnerConfig(policy=PolicyLossConfig(fork_weighting=weighting))  # type: ignore[arg-type]
    with torch.no_grad():
        old = tree_forward(model, batch)
    targets = LossTargets.build(batch, batch_gae(batch, old.values, cfg.advantage), old, cfg.policy)
    model.zero_grad()
    tree_loss, _ = compute_losses(tree_forward(model, batch), targets, cfg)
    tree_loss.backward()
    tree_grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    flat = flatten(batch)
    idx, w = flat.cat_index(), flat.cat_weight()
    if weighting == "unit":  # unit weights: each unique token weighs 1, split over its occurrences
        w = torch.ones_like(w) / torch.zeros(batch.num_tokens, dtype=torch.float64).index_add_(
            0, idx, torch.ones_like(w)
        )[idx]
    model.zero_grad()
    flat_loss, _ = compute_losses(flat_forward(model, batch, flat), targets.select(idx, w), cfg)
    flat_loss.backward()
    flat_grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert torch.allclose(tree_loss, flat_loss, atol=1e-12)
    assert len(tree_grads) == len(flat_grads) > 0
    for a, b in zip(tree_grads, flat_grads, strict=True):
        assert torch.allclose(a, b, atol=1e-12)
