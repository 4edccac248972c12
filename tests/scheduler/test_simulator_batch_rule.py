"""The batch rule: which finished rollouts a step consumes, and the staleness bound where it consumes them."""

from __future__ import annotations

import math

import pytest

from sapwood.scheduler.simulator.cluster import ClusterSim, make_policy
from sapwood.scheduler.simulator.workload import SMALL, Workload
from tests.support.simulator import run_with_durations

# 2 cells (Async: one rolls out, one trains), 4 slots, batch 2, bound 1, 1-second steps, free switches, no timeout.
TINY = Workload(
    cells=2,
    slots_per_cell=4,
    batch_size=2,
    steps=3,
    rollout_p50_s=1.0,
    tail_ratio=1.0,
    train_cell_s_per_step=1.0,
    switch_cost_s=0.0,
    tick_s=1.0,
    max_staleness=1,
    timeout_factor=math.inf,  # the 10-second straggler below must not be cut
)


# Rollout 2 (admitted at version 0) is consumed by step 1: staleness 1 = the bound. Rollout 3 (version 0)
# lasts 10 s, so it finishes after version 2 exists: staleness 2 = bound + 1.
BOUNDARY = [1.0, 1.0, 1.0, 10.0]


def test_first_finished_keeps_a_rollout_exactly_at_the_bound_and_drops_one_past_it() -> None:
    r = run_with_durations(TINY.with_(batch_rule="first_finished", stale_rollouts="drop"), BOUNDARY)
    assert r.steps == 3
    assert r.staleness[2] == 1  # rollout 2 at the bound: trained, full weight
    assert r.weights[2] == 1.0
    assert r.dropped == [2]  # rollout 3, one past the bound
    assert r.trained[3] == 0
    assert max(r.staleness) == 1


def test_first_finished_discount_weights_a_rollout_past_the_bound() -> None:
    r = run_with_durations(
        TINY.with_(batch_rule="first_finished", stale_rollouts="discount", stale_weight=0.25), BOUNDARY
    )
    assert r.dropped == []
    assert r.trained[3] == 1
    by_staleness = dict(zip(r.staleness, r.weights, strict=True))
    assert by_staleness[1] == 1.0
    assert by_staleness[2] == 0.25


def test_exact_batch_waits_for_its_own_rollouts() -> None:
    r = run_with_durations(TINY.with_(batch_rule="exact"), BOUNDARY)
    assert r.dropped == []
    assert list(r.trained[: TINY.rollouts]) == [1] * TINY.rollouts
    assert max(r.staleness) == 1  # rollout 3 is trained by step 1, exactly at the bound
    assert r.wall_s >= 10.0 + 2 * 1.0  # step 1 cannot start before rollout 3 finishes at t = 10


@pytest.mark.parametrize("rule", [{"batch_rule": "exact"}, {"batch_rule": "first_finished", "stale_rollouts": "drop"}])
@pytest.mark.parametrize("policy", ["async", "elastic"])
def test_no_rollout_is_trained_past_the_bound(rule: dict[str, str], policy: str) -> None:
    w = SMALL.with_(tail_ratio=8.0, **rule)
    sim = ClusterSim(w, make_policy(policy, w), seed=1)
    r = sim.run()
    assert r.steps == w.steps
    assert max(r.staleness) <= w.max_staleness
    assert all(s > w.max_staleness for s in r.dropped)


def test_workload_rejects_unknown_batch_rules() -> None:
    with pytest.raises(ValueError, match="batch_rule"):
        Workload(batch_rule="newest")
    with pytest.raises(ValueError, match="stale_rollouts"):
        Workload(stale_rollouts="keep")
    with pytest.raises(ValueError, match="stale_weight"):
        Workload(stale_weight=1.5)
