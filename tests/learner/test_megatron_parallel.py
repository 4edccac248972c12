"""Megatron-core backend over 2 gloo ranks in separate processes: data parallel and tensor parallel.

Each parallel run must end with the weights (and losses) of one rank training the whole batch.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from sapwood.learner.megatron_parallel import ParallelLayout, free_port, init_parallel, teardown_parallel
from sapwood.learner.shard import select_executions, shard_by_execution
from tests.support.megatron_ranks import (
    EXECUTIONS,
    STEPS,
    near_policy_batch,
    rank_main,
    reference_gradients,
    require_megatron,
    run_steps,
    tiny_model,
)

require_megatron()
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")
SEED = 3


Run = dict[str, object]


@pytest.fixture(scope="module")
def single() -> Iterator[dict[str, Run]]:
    """The one-rank reference runs, per loss aggregation."""
    init_parallel(1)
    try:
        yield {agg: run_steps(0, 1, "single", agg, SEED) for agg in ("token", "segment_mean")}
    finally:
        teardown_parallel()


def spawn(mode: str, aggregation: str, tmp_path: Path) -> Run:
    out = tmp_path / f"{mode}-{aggregation}.pt"
    mp.spawn(rank_main, args=(2, free_port(), mode, aggregation, SEED, str(out)), nprocs=2, join=True)
    result: Run = torch.load(out, weights_only=False)
    return result


def assert_same_run(got: Run, want: Run, aggregation: str) -> None:
    # 1. Same targets: the global loss and every gradient equal the tiny torch model's on the whole batch.
    ref_grads, ref_loss = reference_gradients(SEED, aggregation)
    grads = got["grads"]
    assert isinstance(grads, dict)
    assert grads.keys() == ref_grads.keys()
    assert got["grad_loss"] == pytest.approx(ref_loss, rel=1e-12)
    for k, g in ref_grads.items():
        assert torch.allclose(grads[k], g, atol=1e-11), k
    assert sum(float(g.abs().sum()) for g in ref_grads.values()) > 0
    # 2. Whole SAO steps, each rank computing its own targets: the same losses and final weights.
    state, history = got["state"], got["history"]
    ref_state, ref_history = want["state"], want["history"]
    assert isinstance(state, dict)
    assert isinstance(history, list)
    assert isinstance(ref_state, dict)
    assert isinstance(ref_history, list)
    assert len(history) == len(ref_history) == STEPS
    for a, b in zip(history, ref_history, strict=True):
        keys = ("train/loss", "critic/value_loss", "train/catchup_steps", "train/policy_version",
                "critic/grad_norm", "actor/grad_norm")
        assert all(k in a for k in keys if k in b)
        for k in (k for k in keys if k in b):
            assert a[k] == pytest.approx(b[k], rel=1e-6, abs=1e-9), k  # GAE runs in float32
    # The targets pass through float32 (GAE), where last-bit differences of the values can round
    # differently, and AdamW amplifies that on near-zero gradients: ~1e-8 after a step. A missing
    # reduction or a wrong clip would be off by a step's size (~lr = 3e-3).
    initial = tiny_model(SEED).state_dict()
    moved = max(float((ref_state[k] - v).abs().max()) for k, v in initial.items())
    assert moved > 1e-3
    for k, v in ref_state.items():
        assert torch.allclose(state[k], v, atol=1e-6, rtol=0), k


@pytest.mark.parametrize("aggregation", ["token", "segment_mean"])
def test_data_parallel_two_ranks_equal_one_rank_on_the_whole_batch(
    aggregation: str, tmp_path: Path, single: dict[str, Run]
) -> None:
    got = spawn("dp", aggregation, tmp_path)
    where = got["layout"]
    assert isinstance(where, ParallelLayout)
    assert where.data_parallel == 2
    assert where.tensor_parallel == 1
    assert_same_run(got, single[aggregation], aggregation)


def test_tensor_parallel_two_ranks_equal_one_rank(
    tmp_path: Path, single: dict[str, Run]
) -> None:
    got = spawn("tp", "token", tmp_path)
    where = got["layout"]
    assert isinstance(where, ParallelLayout)
    assert where.tensor_parallel == 2
    assert where.data_parallel == 1
    assert_same_run(got, single["token"], "token")


def test_a_replica_that_is_not_data_parallel_trains_alone_in_a_larger_world(
    tmp_path: Path, single: dict[str, Run]
) -> None:
    """``data_parallel=False`` (the core cell's replica): rank 0 of a 2-rank world trains the whole batch
    while rank 1 takes no part; its steps equal the one-rank run (a reduction over the world would wait
    for rank 1 and fail on the timeout)."""
    got = spawn("alone", "token", tmp_path)
    where = got["layout"]
    assert isinstance(where, ParallelLayout)
    assert where.data_parallel == 2, "the world's data-parallel size is 2; the replica ignores it"
    assert_same_run(got, single["token"], "token")


def test_shards_partition_the_batch_by_execution() -> None:
    batch = near_policy_batch(tiny_model(SEED), SEED * 100, num_executions=EXECUTIONS)
    parts = [shard_by_execution(batch, r, 2) for r in range(2)]
    assert sum(p.num_tokens for p in parts) == batch.num_tokens
    assert parts[0].execution_ids == batch.execution_ids[0::2]
    for p in parts:
        p.validate()
        assert bool(p.trainable.any())
    # selecting every execution gives the batch back
    whole = select_executions(batch, range(batch.num_executions))
    for name in ("tokens", "parent", "position", "segment_parent", "execution", "trainable", "rollout_logprob"):
        assert torch.equal(getattr(whole, name), getattr(batch, name)), name
    # a shard's parents point at the same tokens as in the batch
    index = torch.isin(batch.execution, torch.tensor([1, 3])).nonzero().squeeze(1)
    p = parts[1]
    has = p.parent >= 0
    assert torch.equal(index[p.parent[has]], batch.parent[index][has])
    assert torch.equal(p.tokens, batch.tokens[index])
