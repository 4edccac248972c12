"""The sweep's simulation cache reuses a run only where the result is provably the same, and the sweep's
figures are the means of its per-seed figures."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import numpy as np
import pytest

from sapwood.platform.events.cells import CellRole
from sapwood.scheduler.policies.elastic import ElasticPolicy
from sapwood.scheduler.policy import Assignment, Decision
from sapwood.scheduler.signals import Signals
from sapwood.scheduler.simulator import preset, simulate
from sapwood.scheduler.simulator.cache import SimCache
from sapwood.scheduler.simulator.cluster import ClusterSim, make_policy
from sapwood.scheduler.simulator.sweep import compare, half_split, sweep

W = preset("small").with_(steps=3)


def test_a_run_without_moves_is_reused_under_any_switch_or_join_cost() -> None:
    cache = SimCache()
    first = cache.simulate(W, "async", 0, rollout_cells=5)
    assert not first.moves
    for w in (W.with_(switch_cost_s=600.0), W.with_(join_cost_s=300.0)):
        reused = cache.simulate(w, "async", 0, rollout_cells=5)
        assert reused is first
        assert reused.wall_s == simulate(w, "async", 0, rollout_cells=5).wall_s  # and it is the same run
    assert (cache.runs, cache.hits) == (1, 2)


def test_a_run_with_moves_is_run_again_when_a_switch_cost_changes() -> None:
    cache = SimCache()
    cheap = cache.simulate(W, "elastic", 0)
    assert cheap.moves  # Elastic moves cells on this workload
    dear_w = W.with_(switch_cost_s=900.0, join_cost_s=900.0)
    dear = cache.simulate(dear_w, "elastic", 0)
    assert dear is not cheap
    assert dear.wall_s == simulate(dear_w, "elastic", 0).wall_s
    assert dear.wall_s != cheap.wall_s
    assert cache.runs == 2


def test_colocate_is_reused_across_streaming_and_the_same_key_is_reused() -> None:
    cache = SimCache()
    plain = cache.simulate(W, "colocate", 1)
    streamed = cache.simulate(W.with_(streaming_accumulation=True), "colocate", 1)
    assert streamed is plain
    assert plain.wall_s == simulate(W.with_(streaming_accumulation=True), "colocate", 1).wall_s
    assert cache.simulate(W, "colocate", 1) is plain
    elastic_streamed = cache.simulate(W.with_(streaming_accumulation=True), "elastic", 1)
    assert elastic_streamed.wall_s != cache.simulate(W, "elastic", 1).wall_s  # Elastic can stream: not reused
    assert (cache.runs, cache.hits) == (3, 2)


@pytest.mark.parametrize("cells", [2, 3, 8, 16])
def test_half_split_is_the_default_async_split(cells: int) -> None:
    ids = [f"cell-{i:02d}" for i in range(cells)]
    roles = make_policy("async", W).initial_assignment(ids)
    assert half_split(cells) == sum(1 for r in roles.values() if r == "rollout")


def test_compare_takes_half_half_from_the_split_search_and_it_is_the_default_async_run() -> None:
    cmp = compare(W, 2)
    assert cmp.async_half.wall_s == simulate(W, "async", 2).wall_s
    assert cmp.best_static.wall_s <= cmp.async_half.wall_s


def test_sweep_figures_are_the_means_of_the_per_seed_figures() -> None:
    rows = sweep(W, "tail_ratio", [1.0, 6.0], seeds=(0, 1, 2))
    for row in rows:
        per_seed = row["per_seed"]
        assert isinstance(per_seed, dict)
        for key in ("elastic_vs_colocate", "elastic_vs_best_static", "elastic_vs_async_half"):
            assert len(per_seed[key]) == 3
            assert row[key] == pytest.approx(statistics.fmean(per_seed[key]), abs=1e-4)
        w = W.with_(tail_ratio=float(row["tail_ratio"]))  # type: ignore[arg-type]
        assert per_seed["elastic_vs_colocate"][1] == compare(w, 1).ratios()["elastic_vs_colocate"]
    assert rows[0]["per_seed"] != rows[1]["per_seed"]


class CheckingElastic:
    """Elastic that checks, at every decision, the signals' median and switch-cost mean against a fresh
    computation over the simulator's own state (the simulator memoises both between changes)."""

    name = "elastic"
    max_staleness = 1

    def __init__(self) -> None:
        self.inner = ElasticPolicy(max_staleness=1, pin_core=True)
        self.sim: ClusterSim | None = None
        self.checked = 0

    def initial_assignment(self, cell_ids: Sequence[str]) -> dict[str, CellRole]:
        return self.inner.initial_assignment(cell_ids)

    def decide(self, signals: Signals, assignment: Assignment) -> Decision:
        sim = self.sim
        assert sim is not None
        if len(sim.finished_durations) >= sim.w.batch_size:
            assert signals.rollout_p50_s == float(np.median(sim.finished_durations))
            self.checked += 1
        recent = [s.duration_s for s in sim.switch_log[-32:]]
        assert signals.switch_cost_mean_s == (float(np.mean(recent)) if recent else 0.0)
        return self.inner.decide(signals, assignment)


def test_memoised_signals_equal_a_fresh_computation_at_every_tick() -> None:
    w = W.with_(steps=4, tail_ratio=8.0, join_cost_s=45.0)
    pol = CheckingElastic()
    sim = ClusterSim(w, pol, 3)
    pol.sim = sim
    result = sim.run()
    assert pol.checked > 10
    assert len(result.switches) > 1  # the switch-cost mean changed during the run
