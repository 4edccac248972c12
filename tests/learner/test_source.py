"""Batch source: Jmax-bounded subtrees from the store, exact tokens, rewards, exactly-once claims."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from sapwood.learner.assembly import build_batch
from sapwood.learner.batch import ACTION, SUMMARY
from sapwood.learner.claims import BatchSource
from sapwood.learner.config import SourceConfig
from sapwood.platform import runs
from sapwood.platform.store import Store
from sapwood.platform.tree import RewardPolicy
from sapwood.platform.writer import ExecutionWriter
from tests.support.histories import small_execution


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store.open(f"sqlite:///{tmp_path / 's.db'}")


def _fan_out(ways: int) -> ExecutionWriter:
    """An execution that forks ``ways`` ways after a shared 40-token prefix."""
    rng = np.random.default_rng(ways)
    w = ExecutionWriter(run_id="fan", task_id="t", vocab_size=100)
    w.start()
    root = w.prompt(rng.integers(0, 100, 30)).node_id
    first = w.call(root, [1], rng.integers(0, 100, 9), -rng.random(9))
    obs = w.observe(first.output_node_id, rng.integers(0, 100, 5)).node_id
    w.fork(obs, ways)
    for _ in range(ways):
        w.call(obs, [2], rng.integers(0, 100, 6), -rng.random(6))
    w.finish("success", reward=1.0)
    return w


def _path_tokens(batch, leaf_token: int) -> list[int]:
    out = []
    i = leaf_token
    while i >= 0:
        out.append(int(batch.tokens[i]))
        i = int(batch.parent[i])
    return out[::-1]


def test_fork_10_ways_contributes_at_most_jmax_leaves_and_shared_tokens_once(store: Store) -> None:
    w = _fan_out(10)
    store.apply(w.events)
    batch, used = build_batch(store, [w.execution_id], SourceConfig(jmax=4))
    assert used == [w.execution_id]
    assert int((~torch.isnan(batch.leaf_reward)).sum()) == 4
    # 30 prompt + 1 appended + 9 output + 5 observation shared once; each branch adds 1 + 6 tokens
    assert batch.num_tokens == 30 + 1 + 9 + 5 + 4 * (1 + 6)
    assert int(batch.trainable.sum()) == 9 + 4 * 6
    batch.validate(jmax=4)
    full, _ = build_batch(store, [w.execution_id], SourceConfig(jmax=16))
    assert int((~torch.isnan(full.leaf_reward)).sum()) == 10


def test_every_selected_path_is_an_exact_recorded_context(store: Store) -> None:
    w = small_execution(3)
    store.apply(w.events)
    batch, _ = build_batch(store, [w.execution_id], SourceConfig(jmax=8))
    leaves = torch.nonzero(~torch.isnan(batch.leaf_reward)).flatten().tolist()
    recorded = {tuple(w.context(n).tolist()) for n in w.leaves()}
    assert leaves
    assert all(tuple(_path_tokens(batch, leaf)) in recorded for leaf in leaves)
    trainable_roles = set(batch.role[batch.trainable].tolist())
    assert trainable_roles == {ACTION, SUMMARY}, "summary tokens are trainable"
    assert int((batch.segment_parent >= 0).sum()) == 2, "two compaction links"
    lp = batch.rollout_logprob[batch.trainable]
    assert torch.all(lp < 0)
    from sapwood.platform.events import ModelCall

    all_lp = np.concatenate([e.output_logprobs for e in w.events if isinstance(e, ModelCall)])
    assert np.isin(lp.numpy(), all_lp).all(), "rollout log-probs are the recorded ones"


def test_rewards_follow_the_policy(store: Store) -> None:
    timeout = small_execution(4, status="timeout")
    err = small_execution(5, status="error")
    store.apply(timeout.events + err.events)
    batch, used = build_batch(store, [timeout.execution_id, err.execution_id], SourceConfig())
    assert used == [timeout.execution_id], "errors are skipped by default"
    score = timeout.events[-2].score  # type: ignore[attr-defined]
    rewards = batch.leaf_reward[~torch.isnan(batch.leaf_reward)]
    assert torch.allclose(rewards, torch.full_like(rewards, score))
    zero, used = build_batch(store, [timeout.execution_id, err.execution_id],
                             SourceConfig(reward=RewardPolicy(timeout="zero", error="zero")))
    assert len(used) == 2
    assert float(zero.leaf_reward.nan_to_num(0).abs().sum()) == 0


def test_frozen_summarizer_keeps_summaries_in_context_only(store: Store) -> None:
    w = small_execution(6)
    store.apply(w.events)
    batch, _ = build_batch(store, [w.execution_id], SourceConfig(train_summaries=False))
    assert int((batch.role == SUMMARY).sum()) > 0
    assert not bool(batch.trainable[batch.role == SUMMARY].any())


def test_run_is_consumed_exactly_once(store: Store) -> None:
    for seed in range(7):
        store.apply(small_execution(seed).events)
    with store.transaction() as conn:
        runs.create_run(conn, "r", runs.ExecutionFilter(run_id="synthetic"))
    a = BatchSource(store, "r", learner_id="a", config=SourceConfig(executions_per_batch=2))
    b = BatchSource(store, "r", learner_id="b", config=SourceConfig(executions_per_batch=3), prefetch=True)
    seen: list[str] = []
    for src in (a, b, a, b, a):
        got = src.next_batch()
        if got is None:
            continue
        seen += got.execution_ids
        assert not got.complete()
    b.close()
    assert sorted(seen) == sorted(set(seen))
    assert len(seen) == 7
    assert a.next_batch() is None


def test_replay_order_is_reproducible(store: Store) -> None:
    for seed in range(6):
        store.apply(small_execution(seed).events)
    orders = []
    for name in ("x", "y"):
        with store.transaction() as conn:
            runs.create_run(conn, name, runs.ExecutionFilter(), seed=42)
        src = BatchSource(store, name, config=SourceConfig(executions_per_batch=1))
        order = []
        while (got := src.next_batch()) is not None:
            order += got.execution_ids
            got.complete()
        orders.append(order)
    assert orders[0] == orders[1]
    assert len(orders[0]) == 6
