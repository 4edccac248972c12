"""Learner batches as verl-shaped rows (no verl needed): one row per trajectory, exact tokens and log-probs."""

from __future__ import annotations

import math

import pytest

from sapwood.adapters.verl.rows import trajectory_rows
from sapwood.learner.assembly import build_batch
from sapwood.learner.config import SourceConfig
from sapwood.platform.store import Store
from tests.support.verl_trees import record_group


@pytest.fixture
def store(tmp_path) -> Store:  # type: ignore[no-untyped-def]
    return Store.open(f"sqlite:///{tmp_path / 'store.db'}")


def _expected(sample) -> tuple[list[int], list[int], list[int], list[float]]:  # type: ignore[no-untyped-def]
    response: list[int] = []
    mask: list[int] = []
    lps: list[float] = []
    for t, out in enumerate(sample.outputs):
        if t > 0:
            obs = sample.observations[t - 1]
            response += obs
            mask += [0] * len(obs)
            lps += [0.0] * len(obs)
        response += out
        mask += [1] * len(out)
        lps += sample.logprobs[t]
    return sample.prompt, response, mask, lps


def test_each_branch_is_one_row_with_its_exact_tokens_mask_logprobs_and_reward(store: Store) -> None:
    eid, samples = record_group(store, "r", "t0", samples=3, turns=2, seed=0)
    batch, used = build_batch(store, [eid], SourceConfig(jmax=8))
    assert used == [eid]
    rows, untrainable = trajectory_rows(batch)
    assert untrainable == 0
    assert len(rows) == 3
    got = sorted(((r.prompt_ids, r.response_ids, r.response_mask, r.reward) for r in rows), key=lambda x: x[3])
    for row, sample in zip(got, sorted(samples, key=lambda s: s.reward), strict=True):
        prompt, response, mask, _ = _expected(sample)
        assert row[0] == prompt
        assert row[1] == response
        assert row[2] == mask
        assert row[3] == pytest.approx(sample.reward)
    by_reward = {round(r.reward, 6): r for r in rows}
    for sample in samples:
        _, _, _, lps = _expected(sample)
        assert by_reward[round(sample.reward, 6)].rollout_log_probs == pytest.approx(lps)
    assert {r.execution_id for r in rows} == {eid}


def test_jmax_bounds_the_rows_of_one_execution(store: Store) -> None:
    eid, _ = record_group(store, "r", "t0", samples=5, turns=1, seed=1)
    batch, _ = build_batch(store, [eid], SourceConfig(jmax=2))
    rows, _ = trajectory_rows(batch)
    assert len(rows) == 2  # at most Jmax trajectories per execution
    batch, _ = build_batch(store, [eid], SourceConfig(jmax=5))
    rows, _ = trajectory_rows(batch)
    assert len(rows) == 5  # exactly at the bound: all of them


def test_rewards_are_finite_and_a_zero_reward_stays_zero(store: Store) -> None:
    eid, _ = record_group(store, "r", "t0", samples=2, turns=1, seed=2)
    batch, _ = build_batch(store, [eid], SourceConfig())
    rows, _ = trajectory_rows(batch)
    assert all(math.isfinite(r.reward) for r in rows)
    assert min(r.reward for r in rows) == 0.0  # branch 0's reward is exactly 0, not NaN-turned-0
