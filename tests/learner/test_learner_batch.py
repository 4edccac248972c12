"""TreeBatch structure: pointer-doubling primitives vs loops, validation, flatten, random trees."""

from __future__ import annotations

import math
import random

import pytest
import torch

from sapwood.learner import forest
from sapwood.learner.batch import ACTION, OBSERVATION, PROMPT, SUMMARY, TreeBatch, TreeBatchBuilder, tree_attention_mask
from sapwood.learner.errors import BatchValidationError
from sapwood.learner.flat import flatten
from tests.support.random_trees import random_tree_batch


def random_forest(n: int, seed: int) -> torch.Tensor:
    rng = random.Random(seed)
    parent = [-1 if i == 0 or rng.random() < 0.1 else rng.randrange(max(0, i - 5), i) for i in range(n)]
    return torch.tensor(parent, dtype=torch.int64)


def loop_accumulate(parent: list[int], weight: list[float], const: list[float]) -> list[float]:
    y = list(const)
    for i in reversed(range(len(parent))):  # parents come before children
        if parent[i] >= 0:
            y[parent[i]] += weight[i] * y[i]
    return y


@pytest.mark.parametrize("seed", range(5))
def test_tree_accumulate_matches_loop(seed: int) -> None:
    parent = random_forest(300, seed)
    g = torch.Generator().manual_seed(seed)
    weight = torch.rand(300, generator=g, dtype=torch.float64)
    const = torch.randn(300, generator=g, dtype=torch.float64)
    got = forest.tree_accumulate(parent, weight, const)
    want = loop_accumulate(parent.tolist(), weight.tolist(), const.tolist())
    assert torch.allclose(got, torch.tensor(want, dtype=torch.float64), atol=1e-10)


@pytest.mark.parametrize("seed", range(3))
def test_depth_root_mask_match_loops(seed: int) -> None:
    parent = random_forest(200, seed)
    p = parent.tolist()
    depth, root = [0] * 200, list(range(200))
    for i in range(200):
        if p[i] >= 0:
            depth[i], root[i] = depth[p[i]] + 1, root[p[i]]
    assert forest.depth(parent).tolist() == depth
    assert forest.root_of(parent).tolist() == root
    mask = torch.zeros(200, 200, dtype=torch.bool)
    for i in range(200):
        j = i
        while j >= 0:
            mask[i, j] = True
            j = p[j]
    assert torch.equal(tree_attention_mask(parent), mask)


def test_long_chain_needs_only_log_rounds() -> None:
    n = 50_000
    parent = torch.arange(-1, n - 1)
    assert forest.depth(parent)[-1].item() == n - 1
    y = forest.tree_accumulate(parent, torch.full((n,), 0.5, dtype=torch.float64), torch.ones(n, dtype=torch.float64))
    assert y[0].item() == pytest.approx(2.0)  # sum of 0.5**k


def small_batch() -> TreeBatch:
    b = TreeBatchBuilder()
    e = b.add_execution("e0", "math")
    p = b.add_run(e, -1, [1, 2], PROMPT)
    a = b.add_run(e, p, [3, 4], ACTION, logprobs=[-0.1, -0.2])
    o1 = b.add_run(e, a, [5], OBSERVATION)
    b.add_run(e, o1, [6, 7], ACTION, logprobs=[-0.3, -0.4], reward=1.0)
    o2 = b.add_run(e, a, [8], OBSERVATION)
    s = b.add_run(e, o2, [9, 10], SUMMARY, logprobs=[-0.5, -0.6])
    r = b.add_run(e, -1, [1, 11], PROMPT, segment_parent=s)
    b.add_run(e, r, [12], ACTION, logprobs=[-0.7], reward=0.0)
    return b.build()


def test_builder_and_derived_fields() -> None:
    batch = small_batch()
    batch.validate(jmax=2)
    assert batch.num_tokens == 13
    assert batch.position.tolist() == [0, 1, 2, 3, 4, 5, 6, 4, 5, 6, 0, 1, 2]
    assert batch.is_leaf().nonzero().squeeze(1).tolist() == [6, 12]
    assert batch.trajectories_per_execution().tolist() == [2]
    assert batch.segment_start().tolist() == [0] * 10 + [10] * 3
    assert batch.logical_parent()[10].item() == 9
    with pytest.raises(BatchValidationError, match="Jmax is 1"):
        batch.validate(jmax=1)


def test_small_batch_positions_are_depths() -> None:
    batch = small_batch()
    assert torch.equal(batch.position, forest.depth(batch.parent))


@pytest.mark.parametrize(
    ("field", "index", "value", "message"),
    [
        ("parent", 3, 7, "earlier token"),
        ("position", 2, 5, "position"),
        ("role", 0, 7, "role"),
        ("trainable", 4, True, "only action and summary"),
        ("rollout_logprob", 0, -1.0, "0 where not trainable"),
        ("rollout_logprob", 2, 0.5, "<= 0"),
        ("policy_version", 2, -1, "policy_version"),
        ("policy_version", 0, 3, "-1 on prompt"),
        ("leaf_reward", 6, math.nan, "finite leaf_reward"),
        ("leaf_reward", 3, 1.0, "NaN except at logical leaves"),
        ("segment_parent", 12, 4, "summary token"),
        ("execution", 1, 1, "execution"),
    ],
)
def test_validate_rejects(field: str, index: int, value: object, message: str) -> None:
    batch = small_batch()
    getattr(batch, field)[index] = value
    with pytest.raises(BatchValidationError, match=message):
        batch.validate()


def test_validate_rejects_shapes_and_lists() -> None:
    batch = small_batch()
    batch.role = batch.role[:-1]
    with pytest.raises(BatchValidationError, match=r"role: expected shape \[13\], got \[12\]"):
        batch.validate()
    batch = small_batch()
    batch.rollout_logprob = batch.rollout_logprob.double()
    with pytest.raises(BatchValidationError, match="dtype"):
        batch.validate()
    batch = small_batch()
    batch.task_family.append("swe")
    with pytest.raises(BatchValidationError, match="task_family"):
        batch.validate()


@pytest.mark.parametrize("seed", range(20))
def test_random_batches_are_valid_and_flatten_weights_sum_to_the_path_weight(seed: int) -> None:
    batch = random_tree_batch(seed, jmax=4)
    batch.validate(jmax=4)
    flat = flatten(batch)
    index, weight = flat.cat_index(), flat.cat_weight()
    # Per-trajectory weights, summed over every trajectory a token is on, give the tree's path weight.
    total = torch.zeros(batch.num_tokens, dtype=torch.float64).index_add_(0, index, weight)
    assert torch.allclose(total, batch.path_weight(), rtol=0, atol=1e-12)
    # Each execution's trajectories are a probability distribution.
    leaf = batch.is_leaf()
    per_exec = torch.zeros(batch.num_executions, dtype=torch.float64).index_add_(
        0, batch.execution[leaf], batch.path_weight()[leaf]
    )
    assert torch.allclose(per_exec, torch.ones(batch.num_executions, dtype=torch.float64))
    assert set(flat.trajectory) == set(leaf.nonzero().squeeze(1).tolist())
    for seq in flat.token_index:  # each sequence is a causal context path
        assert batch.parent[seq[0]].item() == -1
        assert torch.equal(batch.parent[seq[1:]], seq[:-1])
        assert torch.equal(batch.position[seq], torch.arange(seq.numel()))


def test_random_batches_cover_every_feature() -> None:
    forks = segments = shared_prompt = obs_leaf = untrained_action = 0
    for seed in range(30):
        b = random_tree_batch(seed)
        forks += int((forest.child_count(b.logical_parent()) > 1).sum())
        starts = b.segment_parent >= 0
        segments += int(starts.sum())
        shared_prompt += int((starts & (b.parent >= 0)).sum())
        obs_leaf += int((b.is_leaf() & (b.role == OBSERVATION)).sum())
        untrained_action += int(((b.role == ACTION) & ~b.trainable).sum())
    assert min(forks, segments, shared_prompt, obs_leaf, untrained_action) > 0


def test_to_device_copies() -> None:
    batch = small_batch()
    moved = batch.to("cpu")
    assert torch.equal(moved.tokens, batch.tokens)
    assert moved.execution_ids == batch.execution_ids


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_context_view_gives_its_tokens_the_whole_batchs_outputs(seed: int) -> None:
    """The view of some trainable tokens holds them and every context ancestor, re-indexed; its forward gives
    those tokens the whole batch's log-probs and values; the weights stay the whole batch's."""
    from sapwood.learner.model import TinyActorCritic, TinyTransformerConfig, tree_forward

    batch = random_tree_batch(seed, num_executions=4, jmax=4, max_segments=3, vocab_size=32)
    torch.manual_seed(seed)
    model = TinyActorCritic(TinyTransformerConfig(vocab_size=32, d_model=16, n_heads=2, n_layers=1, d_ff=32,
                                                  max_position=256))
    trainable = batch.trainable.nonzero().squeeze(1)
    chosen = torch.zeros_like(batch.trainable)
    chosen[trainable[len(trainable) // 3: 2 * len(trainable) // 3]] = True
    view, index = batch.context_view(chosen)
    assert view.num_tokens < batch.num_tokens, "a third of the trainable tokens need less than the whole batch"
    assert torch.equal(index, index.sort().values), "the view keeps the batch's order (parents first)"
    assert bool(chosen[index].sum() == chosen.sum()), "every chosen token is in the view"
    ancestors = batch.attention_mask()[chosen].any(dim=0)
    assert torch.equal(torch.zeros_like(chosen).index_fill_(0, index, True), ancestors | chosen)
    assert torch.equal(index[view.parent[view.parent >= 0]], batch.parent[index][view.parent >= 0])
    torch.testing.assert_close(view.token_weight(), batch.token_weight()[index])
    with torch.no_grad():
        whole, part = tree_forward(model, batch), tree_forward(model, view)
    local = chosen[index]
    torch.testing.assert_close(part.logprob[local], whole.logprob[index][local], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(part.values[local], whole.values[index][local], rtol=1e-5, atol=1e-6)


def test_a_context_view_of_everything_is_the_batch_and_of_nothing_is_empty() -> None:
    batch = random_tree_batch(5, num_executions=2, jmax=4, max_segments=3, vocab_size=32)
    whole, index = batch.context_view(torch.ones_like(batch.trainable))
    assert torch.equal(index, torch.arange(batch.num_tokens))
    assert torch.equal(whole.parent, batch.parent)
    assert torch.equal(whole.segment_parent, batch.segment_parent)
    empty, none = batch.context_view(torch.zeros_like(batch.trainable))
    assert empty.num_tokens == 0
    assert none.numel() == 0
    with pytest.raises(ValueError, match=r"\[T\] bool mask"):
        batch.context_view(torch.ones(batch.num_tokens, dtype=torch.int64))
