"""Streaming gradient accumulation and the satellite join cost (a move into training), apart from the switch cost."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sapwood.scheduler.simulator import preset, simulate
from sapwood.scheduler.simulator.workload import Workload
from tests.support.simulator import run_with_durations

# 2 cells: Async rolls out on cell-00 and trains on cell-01 (the core cell); batch 2, one step of 2 cell-seconds
# (1 per rollout), free switches, no timeout.
TINY = Workload(
    cells=2,
    slots_per_cell=4,
    batch_size=2,
    steps=1,
    rollout_p50_s=1.0,
    tail_ratio=1.0,
    train_cell_s_per_step=2.0,
    switch_cost_s=0.0,
    tick_s=1.0,
    max_staleness=1,
    timeout_factor=math.inf,
    core_cells=1,
)


def test_streaming_works_off_each_rollout_as_it_finishes() -> None:
    whole = run_with_durations(TINY, [1.0, 5.0])
    streamed = run_with_durations(TINY.with_(streaming_accumulation=True), [1.0, 5.0])
    assert whole.wall_s == pytest.approx(5.0 + 2.0)  # the step starts when its last rollout is done
    assert streamed.wall_s == pytest.approx(5.0 + 1.0)  # rollout 0's share was worked off during t = 1 … 2
    np.testing.assert_array_equal(streamed.trained[:2], 1)


def test_streaming_with_rollouts_finishing_together_changes_nothing() -> None:
    whole = run_with_durations(TINY, [5.0, 5.0])
    streamed = run_with_durations(TINY.with_(streaming_accumulation=True), [5.0, 5.0])
    assert streamed.wall_s == pytest.approx(whole.wall_s)


@pytest.mark.parametrize("policy", ["elastic", "async"])
def test_streaming_keeps_every_rollout_trained_once_within_the_bound(policy: str) -> None:
    w = preset("small").with_(tail_ratio=8.0, streaming_accumulation=True)
    r = simulate(w, policy, seed=1)
    assert r.steps == w.steps
    np.testing.assert_array_equal(r.trained, 1)
    assert max(r.staleness) <= w.max_staleness


def test_colocate_cannot_stream() -> None:
    w = preset("small").with_(steps=3)
    assert simulate(w.with_(streaming_accumulation=True), "colocate", 0).wall_s == simulate(w, "colocate", 0).wall_s


def test_zero_variance_colocate_pays_the_join_cost_into_training_and_the_switch_cost_out() -> None:
    w = preset("small").with_(tail_ratio=1.0, switch_cost_s=7.0, join_cost_s=40.0)
    waves = math.ceil(w.batch_size / (w.cells * w.slots_per_cell))
    per_step = waves * w.rollout_p50_s + w.train_cell_s_per_step / w.cells
    closed = w.steps * (per_step + w.join_cost_s) + (w.steps - 1) * w.switch_cost_s  # type: ignore[operator]
    r = simulate(w, "colocate", 0)
    assert r.wall_s == pytest.approx(closed, rel=1e-12)
    assert {s.duration_s for s in r.switches if s.to_role == "train"} == {40.0}
    assert {s.duration_s for s in r.switches if s.to_role == "rollout"} == {7.0}


def test_join_cost_defaults_to_the_switch_cost() -> None:
    w = Workload(switch_cost_s=12.0)
    assert w.switch_cost_to("train") == 12.0
    assert w.with_(join_cost_s=0.0).switch_cost_to("train") == 0.0
    assert w.with_(join_cost_s=0.0).switch_cost_to("rollout") == 12.0


@pytest.mark.parametrize("bad", [-1.0, math.inf, math.nan])
def test_workload_rejects_a_bad_join_cost(bad: float) -> None:
    with pytest.raises(ValueError, match="join_cost_s"):
        Workload(join_cost_s=bad)
