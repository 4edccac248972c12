"""Policies on scripted traces: step changes, oscillation (no flapping), the switch-cost gate, lost cells."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from sapwood.platform.events.cells import CellRole
from sapwood.scheduler.policies import AsyncPolicy, ColocatePolicy, ElasticPolicy
from sapwood.scheduler.policy import Decision, check_decision, load_policy
from sapwood.scheduler.signals import CellState, Signals

CELLS, CAP, BATCH, TICK = 8, 4, 32, 60.0


def run_trace(
    policy: ElasticPolicy, ticks: int, make: Callable[[int], dict[str, object]], initial: CellRole = "rollout"
) -> tuple[list[dict[str, CellRole]], list[tuple[int, str, CellRole, str]]]:
    """Apply each decision at once; return the assignment after every tick and the moves (tick, cell, to, why)."""
    ids = [f"c{i}" for i in range(CELLS)]
    assignment: dict[str, CellRole] = dict.fromkeys(ids, initial)
    since = dict.fromkeys(ids, -1e9)
    history, moves = [], []
    for k in range(ticks):
        now = k * TICK
        cells = tuple(CellState(c, "core", CAP, assignment[c], since[c], now) for c in ids)
        s = Signals(at_s=now, cells=cells, batch_size=BATCH, **make(k))  # type: ignore[arg-type]
        d = check_decision(policy.decide(s, assignment), s)
        for cid, (_, to) in d.moves(assignment).items():
            assert d.reasons[cid], "every move carries a reason"
            moves.append((k, cid, to, d.reasons[cid]))
            since[cid] = now
        assignment = dict(d.target)
        history.append(assignment)
    return history, moves


def rollout_capacity(a: dict[str, CellRole]) -> int:
    return sum(CAP for r in a.values() if r == "rollout")


def busy_training(k: int) -> dict[str, object]:
    return {"rollout_demand": 4, "in_flight": 4, "train_active": True, "train_remaining_cell_s": 8 * 600.0,
            "train_step_cell_s": 8 * 600.0, "rollout_p50_s": 600.0, "rollout_completions_per_s": 0.01}


def generating(k: int) -> dict[str, object]:
    return {"rollout_demand": 32, "in_flight": 4, "backlog_executions": 0, "train_active": False,
            "train_step_cell_s": 8 * 600.0, "rollout_p50_s": 600.0, "rollout_completions_per_s": 0.01}


def test_step_change_in_backlog_is_answered_within_k_ticks() -> None:
    policy = ElasticPolicy(min_dwell_s=60, max_moves_per_tick=4, switch_cost_prior_s=10)
    step_at, k_max = 5, 3  # 7 cells to move at 4 per tick, dwell of one tick: 2 ticks suffice, 3 allowed
    history, _ = run_trace(policy, 12, lambda k: busy_training(k) if k < step_at else generating(k))
    # before the step: the surplus rollout cells went to training, one rollout cell kept for the 4 rollouts
    assert rollout_capacity(history[step_at - 1]) < 32
    assert rollout_capacity(history[step_at - 1]) >= 4
    answered = [k for k in range(step_at, 12) if rollout_capacity(history[k]) >= 32]
    assert answered, f"capacity reached 32 only at ticks {answered}"
    assert answered[0] - step_at < k_max, f"capacity reached 32 only at ticks {answered}"


def test_oscillating_backlog_causes_no_flapping() -> None:
    dwell = 5 * TICK
    policy = ElasticPolicy(min_dwell_s=dwell, max_moves_per_tick=8, switch_cost_prior_s=1)
    _, moves = run_trace(policy, 60, lambda k: busy_training(k) if k % 2 else generating(k))
    assert moves, "the trace must move cells at all for the check to mean anything"
    last: dict[str, int] = {}
    for k, cid, _, _ in moves:
        if cid in last:
            assert (k - last[cid]) * TICK >= dwell, f"{cid} moved at ticks {last[cid]} and {k}, dwell {dwell}s"
        last[cid] = k
    # no more than one move per cell per dwell window, over the whole trace
    assert len(moves) <= CELLS * (60 * TICK / dwell + 1)


@pytest.mark.parametrize(("switch_cost", "expect_moves"), [(3 * 3600.0, False), (1.0, True)])
def test_switch_cost_gate_holds_moves_that_would_not_pay(switch_cost: float, expect_moves: bool) -> None:
    """Cells idle in rollout could train for ~600 s each: with a 3 h switch cost nothing moves, with 1 s they do."""
    policy = ElasticPolicy(min_dwell_s=0, switch_cost_prior_s=10)

    def trace(k: int) -> dict[str, object]:
        return {**busy_training(k), "switch_cost_mean_s": switch_cost}

    _, moves = run_trace(policy, 4, trace)
    # all cells start in rollout, so the first train cell is a starvation move, which the gate never holds
    assert [m[3] for m in moves if m[3].startswith("starved")] == [moves[0][3]]
    gated = [m for m in moves if not m[3].startswith("starved")]
    assert bool(gated) is expect_moves, gated


def test_gate_bypassed_only_for_starvation() -> None:
    """Training work waits and no cell trains: one cell moves whatever the switch cost."""
    policy = ElasticPolicy(min_dwell_s=0)

    def trace(k: int) -> dict[str, object]:
        return {**generating(k), "backlog_executions": BATCH, "rollout_demand": 64, "switch_cost_mean_s": 1e6}

    history, moves = run_trace(policy, 3, trace)
    assert sum(1 for r in history[-1].values() if r == "train") == 1
    assert all(to == "train" for _, _, to, _ in moves)


def test_staleness_bound_stops_growing_rollout() -> None:
    policy = ElasticPolicy(min_dwell_s=0, staleness_bound=1)

    def stale(k: int) -> dict[str, object]:
        return {**generating(k), "backlog_executions": BATCH, "staleness_max": 2}  # a stale batch waits

    _, moves = run_trace(policy, 3, stale, initial="train")
    assert not any(to == "rollout" for _, _, to, _ in moves)
    _, fresh_moves = run_trace(policy, 3, lambda k: {**stale(k), "staleness_max": 1}, initial="train")
    assert any(to == "rollout" for _, _, to, _ in fresh_moves)


def test_lost_cell_goes_idle_with_reason() -> None:
    cells = (CellState("a", role="train"), CellState("b", role="rollout", lost=True, last_heartbeat_s=3.0))
    s = Signals(at_s=100.0, cells=cells, batch_size=4)
    for policy in (ElasticPolicy(), AsyncPolicy(), ColocatePolicy()):
        d = policy.decide(s, {"a": "train", "b": "rollout"})
        assert d.target["b"] == "idle"
        assert "lost" in d.reasons["b"]


def test_colocate_and_async_decisions() -> None:
    ids = [f"c{i}" for i in range(4)]
    cells = tuple(CellState(c, role="rollout") for c in ids)
    ready = Signals(at_s=0, cells=cells, batch_size=4, backlog_executions=4)
    assert set(ColocatePolicy().decide(ready, dict.fromkeys(ids, "rollout")).target.values()) == {"train"}
    split = AsyncPolicy(rollout_cells=3).initial_assignment(ids)
    assert list(split.values()).count("rollout") == 3
    assert AsyncPolicy().decide(ready, split).target == split


def test_load_policy_by_name_and_path() -> None:
    assert isinstance(load_policy("elastic", min_dwell_s=5), ElasticPolicy)
    assert isinstance(load_policy("sapwood.scheduler.policies.static:AsyncPolicy"), AsyncPolicy)
    assert isinstance(load_policy("sapwood.scheduler.policies.colocate.ColocatePolicy"), ColocatePolicy)
    with pytest.raises(ValueError, match="cannot import"):
        load_policy("no.such.module:X")
    with pytest.raises(ValueError, match="no attribute"):
        load_policy("sapwood.scheduler.policies.static:Nope")


def test_check_decision_rejects_bad_targets() -> None:
    s = Signals(at_s=0, cells=(CellState("a"),), batch_size=1)
    with pytest.raises(ValueError, match="missing"):
        check_decision(Decision({}), s)
    with pytest.raises(ValueError, match="unknown roles"):
        check_decision(Decision({"a": "dance"}), s)  # type: ignore[dict-item]


def test_signals_reject_bad_values() -> None:
    with pytest.raises(ValueError, match="batch_size"):
        Signals(at_s=0, cells=(), batch_size=0)
    with pytest.raises(ValueError, match="at_s"):
        Signals(at_s=float("nan"), cells=(), batch_size=1)
    with pytest.raises(ValueError, match="duplicate"):
        Signals(at_s=0, cells=(CellState("a"), CellState("a")), batch_size=1)


def surplus_signals(at_s: float, since: float, demand: int) -> Signals:
    """Two rollout cells of 4 slots and one train cell with a long step running."""
    cells = (CellState("r0", "satellite", 4, "rollout", since), CellState("r1", "satellite", 4, "rollout", since),
             CellState("t0", "core", 4, "train", 0.0))
    return Signals(at_s=at_s, cells=cells, batch_size=BATCH, rollout_demand=demand, in_flight=demand,
                   train_active=True, train_remaining_cell_s=3600.0, train_step_cell_s=3600.0, rollout_p50_s=600.0,
                   rollout_completions_per_s=0.01, switch_cost_mean_s=1.0)


def test_min_dwell_boundary_is_inclusive() -> None:
    policy = ElasticPolicy(min_dwell_s=60.0, hysteresis_slots=0)
    assignment: dict[str, CellRole] = {"r0": "rollout", "r1": "rollout", "t0": "train"}
    assert not policy.decide(surplus_signals(159.999, 100.0, 4), assignment).moves(assignment)
    assert len(policy.decide(surplus_signals(160.0, 100.0, 4), assignment).moves(assignment)) == 1


def test_hysteresis_boundary() -> None:
    """Releasing one of two 4-slot cells leaves 4 slots: allowed iff 4 ≥ demand + hysteresis."""
    assignment: dict[str, CellRole] = {"r0": "rollout", "r1": "rollout", "t0": "train"}
    for hysteresis, demand, moves in [(1, 3, 1), (1, 4, 0), (0, 4, 1), (0, 5, 0)]:
        d = ElasticPolicy(min_dwell_s=0, hysteresis_slots=hysteresis).decide(surplus_signals(10, 0, demand), assignment)
        assert len(d.moves(assignment)) == moves, (hysteresis, demand, d.reasons)


def test_switch_cost_gate_boundary() -> None:
    """Saved = min(idle 3600/1 s, work 3600/2 s) = 1800 s; the gate needs saved > margin × 2 × cost."""
    assignment: dict[str, CellRole] = {"r0": "rollout", "r1": "rollout", "t0": "train"}
    policy = ElasticPolicy(min_dwell_s=0, hysteresis_slots=0, round_trip=True)
    for cost, moves in [(899.999, 1), (900.0, 0)]:
        s = dataclasses.replace(surplus_signals(10, 0, 0), switch_cost_mean_s=cost, in_flight=0)
        assert len(policy.decide(s, assignment).moves(assignment)) == moves, cost
