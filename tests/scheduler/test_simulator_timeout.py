"""The rollout timeout: a rollout running past ``timeout_factor × p50`` is cut there and partial-scored."""

from __future__ import annotations

import math

import pytest

from sapwood.scheduler.simulator.workload import Workload
from tests.support.simulator import run_with_durations

# 1-second median rollouts, timeout 3 s; 2 cells (Async: one rolls out, one trains); batch 2.
TINY = Workload(
    cells=2,
    slots_per_cell=4,
    batch_size=2,
    steps=2,
    rollout_p50_s=1.0,
    tail_ratio=1.0,
    train_cell_s_per_step=1.0,
    switch_cost_s=0.0,
    tick_s=1.0,
    max_staleness=0,
    timeout_factor=3.0,
)


def test_a_rollout_exactly_at_the_timeout_is_not_cut_and_one_past_it_is_partial_scored() -> None:
    r = run_with_durations(TINY, [3.0, 6.0])
    assert TINY.rollout_timeout_s == 3.0
    assert r.timed_out == {1: 0.5}  # rollout 0 ends exactly at the timeout: complete, not cut
    assert r.trained[1] == 1  # a cut rollout is still trained on (partial score)
    # step 0 starts when both are done (t = 3), not when rollout 1 would have finished (t = 6)
    assert r.wall_s < run_with_durations(TINY.with_(timeout_factor=math.inf), [3.0, 6.0]).wall_s


def test_no_timeout_leaves_long_rollouts_whole() -> None:
    r = run_with_durations(TINY.with_(timeout_factor=math.inf), [3.0, 60.0])
    assert r.timed_out == {}
    assert r.wall_s >= 60.0


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan])
def test_workload_rejects_a_bad_timeout(bad: float) -> None:
    with pytest.raises(ValueError, match="timeout_factor"):
        Workload(timeout_factor=bad)
