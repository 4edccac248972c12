"""Fair baselines: Async at its best static split (re-tuned per sweep point) and core cells pinned to training."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from sapwood.platform.events.cells import CellRole
from sapwood.scheduler.policies.colocate import ColocatePolicy
from sapwood.scheduler.policies.common import all_to
from sapwood.scheduler.policy import Assignment, Decision
from sapwood.scheduler.signals import Signals
from sapwood.scheduler.simulator import preset, simulate
from sapwood.scheduler.simulator.sweep import best_static, static_splits, sweep, train_ratio
from sapwood.scheduler.simulator.workload import Workload

# Training cheap (0.1 of a median rollout on the whole cluster): the best split is rollout-heavy, not half/half.
CHEAP_TRAIN = train_ratio(preset("small").with_(steps=4), 0.1)


def test_best_static_split_is_at_least_as_fast_as_every_other_split() -> None:
    k, best = best_static(CHEAP_TRAIN, seed=1)
    splits = static_splits(CHEAP_TRAIN, seed=1)
    assert [r for r, _ in splits] == list(range(1, CHEAP_TRAIN.cells - CHEAP_TRAIN.core_cells + 1))
    for r, res in splits:
        assert best.wall_s <= res.wall_s, f"split {r} beats the chosen best split {k}"
    assert k != CHEAP_TRAIN.cells // 2  # the workload is chosen so that half/half is not the best split


def test_sweep_retunes_the_best_split_at_every_point() -> None:
    rows = sweep(CHEAP_TRAIN, "train_ratio", [0.1, 2.0], seeds=(1, 2), transform=train_ratio)
    for row in rows:
        w = train_ratio(CHEAP_TRAIN, float(row["train_ratio"]))  # type: ignore[arg-type]
        assert row["best_static_rollout_cells"] == [best_static(w, seed=s)[0] for s in (1, 2)]
    cheap, dear = (r["best_static_rollout_cells"] for r in rows)
    assert cheap[0] > dear[0]  # type: ignore[index]  # cheap training: more rollout cells
    for row in rows:
        per_seed = row["per_seed"]
        assert isinstance(per_seed, dict)
        for best, half in zip(per_seed["elastic_vs_best_static"], per_seed["elastic_vs_async_half"], strict=True):
            assert best <= half  # the best split is never slower than half/half


class AllRollout:
    """A policy that tries to send every cell to rollout, always (the simulator must keep core cells training)."""

    name = "all-rollout"
    max_staleness = 1

    def initial_assignment(self, cell_ids: Sequence[str]) -> dict[str, CellRole]:
        return dict.fromkeys(cell_ids, "rollout")

    def decide(self, signals: Signals, assignment: Assignment) -> Decision:
        return all_to("rollout", signals, assignment, "greedy: everything generates")


def core_cells_of(w: Workload) -> list[str]:
    return [f"cell-{i:02d}" for i in range(w.cells - w.core_cells, w.cells)]


@pytest.mark.parametrize("core", [1, 2])
def test_a_pinned_core_cell_never_serves_rollout_even_when_a_policy_asks(core: int) -> None:
    w = preset("small").with_(steps=3, core_cells=core)
    r = simulate(w, AllRollout(), seed=0)
    assert r.pinned == core_cells_of(w)
    assert r.refused_moves > 0
    assert r.steps == w.steps  # the pinned cells do all the training
    for cid in r.pinned:
        assert r.role_cell_s[cid]["rollout"] == 0.0
        assert r.role_cell_s[cid]["train"] == pytest.approx(r.wall_s)


@pytest.mark.parametrize("policy", ["elastic", "async"])
def test_elastic_and_async_keep_core_cells_training_without_a_refusal(policy: str) -> None:
    w = preset("small").with_(steps=4, tail_ratio=8.0, core_cells=2)
    r = simulate(w, policy, seed=2)
    assert r.refused_moves == 0  # the policy itself never tries to move a core cell out of training
    for cid in core_cells_of(w):
        assert r.role_cell_s[cid]["rollout"] == 0.0
    satellites_rollout_s = sum(v["rollout"] for c, v in r.role_cell_s.items() if c not in r.pinned)
    assert satellites_rollout_s > 0


def test_colocate_is_exempt_from_pinning() -> None:
    w = preset("small").with_(steps=2, core_cells=2)
    r = simulate(w, "colocate", seed=0)
    assert r.pinned == []
    for cid in core_cells_of(w):
        assert r.role_cell_s[cid]["rollout"] > 0.0


def test_colocate_admitting_a_batch_ahead_overlaps_the_next_batch_with_the_tail() -> None:
    w = preset("small").with_(steps=4, batch_rule="first_finished")  # "exact" batches need bound 0 here
    sync = simulate(w, "colocate", seed=0)
    ahead = simulate(w, "colocate", seed=0, max_staleness=1)
    assert sync.wall_s == simulate(w, "colocate", seed=0, max_staleness=0).wall_s  # 0 is the default
    assert ahead.wall_s < sync.wall_s
    with pytest.raises(ValueError, match="max_staleness must be ≥ 0"):
        ColocatePolicy(max_staleness=-1)


@pytest.mark.parametrize("bad", [-1, 8])
def test_workload_rejects_a_core_size_outside_zero_to_cells_minus_one(bad: int) -> None:
    with pytest.raises(ValueError, match="core_cells"):
        Workload(cells=8, core_cells=bad)


def test_core_size_bounds_the_static_splits() -> None:
    assert len(static_splits(CHEAP_TRAIN.with_(core_cells=7, steps=1))) == 1
    assert Workload(cells=8, core_cells=7).core_cells == 7


class NoTraining(AllRollout):
    """Sends every cell to rollout and has nothing pinned: the run can never train."""

    pins_core = False


def test_a_policy_that_leaves_no_cell_training_stalls_with_a_clear_error() -> None:
    with pytest.raises(RuntimeError, match="stalled"):
        simulate(preset("small").with_(steps=2), NoTraining(), seed=0)
