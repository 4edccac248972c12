"""Rollout demand from queue lag: calls waiting for a slot plus the occupied slots of live rollout cells."""

from __future__ import annotations

import pytest

from sapwood.scheduler.policies.elastic import ElasticPolicy, Tick
from sapwood.scheduler.signals import CellState, Signals, queue_demand


def cells(*occupied: int, role: str = "rollout", lost: bool = False) -> tuple[CellState, ...]:
    return tuple(CellState(f"c{i}", capacity=2, role=role, occupied=o, lost=lost)  # type: ignore[arg-type]
                 for i, o in enumerate(occupied))


def test_demand_is_waiting_calls_plus_occupied_rollout_slots() -> None:
    assert queue_demand(0, ()) == 0
    assert queue_demand(0, cells(0, 0)) == 0
    assert queue_demand(3, cells(2, 1)) == 6
    assert queue_demand(0, cells(2, 2, role="train")) == 0, "slots of train cells are no rollout demand"
    assert queue_demand(1, cells(2, lost=True)) == 1, "a lost cell's slots are not counted"
    with pytest.raises(ValueError, match="waiting calls must be ≥ 0"):
        queue_demand(-1, ())


def test_signals_refuse_a_negative_demand() -> None:
    with pytest.raises(ValueError, match="rollout_waiting must be ≥ 0"):
        Signals(at_s=0.0, cells=(), batch_size=1, rollout_waiting=-1)
    with pytest.raises(ValueError, match="rollout_demand must be ≥ 0"):
        Signals(at_s=0.0, cells=(), batch_size=1, rollout_demand=-2)


def test_the_elastic_target_follows_the_queue_not_the_running_executions() -> None:
    # 3 cells × 2 slots; 5 executions run, but only 1 call holds a slot and none waits: one rollout cell is
    # enough. With 4 calls waiting on top of 2 occupied slots the policy wants all three.
    policy = ElasticPolicy()
    idle = cells(1, 0, 0)
    quiet = Signals(at_s=10.0, cells=idle, batch_size=4, in_flight=5, rollout_demand=queue_demand(0, idle))
    assert policy.rollout_target(Tick.start(policy, quiet, {c.cell_id: c.role for c in idle})) == 1
    busy_cells = cells(2, 0, 0)
    busy = Signals(at_s=10.0, cells=busy_cells, batch_size=4, in_flight=5, rollout_waiting=4,
                   rollout_demand=queue_demand(4, busy_cells))
    assert policy.rollout_target(Tick.start(policy, busy, {c.cell_id: c.role for c in busy_cells})) == 3
