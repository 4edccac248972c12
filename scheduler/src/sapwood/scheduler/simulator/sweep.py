"""Compare policies on one workload, find the best static split, and sweep the workload's knobs."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sapwood.scheduler.policy import load_policy
from sapwood.scheduler.simulator.cache import SimCache
from sapwood.scheduler.simulator.results import SimResult
from sapwood.scheduler.simulator.workload import Workload


@dataclass
class Comparison:
    """Elastic against Colocate, the half/half Async split and the best static split (hours)."""

    elastic: SimResult
    colocate: SimResult
    async_half: SimResult
    best_static: SimResult
    best_static_rollout_cells: int

    def ratios(self) -> dict[str, float]:
        e = self.elastic.wall_s
        return {
            "elastic_vs_colocate": round(self.colocate.wall_s / e, 4),
            "elastic_vs_async_half": round(self.async_half.wall_s / e, 4),
            "elastic_vs_best_static": round(self.best_static.wall_s / e, 4),
        }

    def wall_h(self) -> dict[str, float]:
        return {k: round(getattr(self, k).wall_s / 3600.0, 3)
                for k in ("elastic", "colocate", "async_half", "best_static")}


def static_splits(workload: Workload, seed: int = 0, cache: SimCache | None = None) -> list[tuple[int, SimResult]]:
    """Async at every static split: ``(rollout cells, result)`` for 1 … cells − core_cells rollout cells
    (the core cells are pinned to training, so no split gives them to rollout)."""
    c = cache if cache is not None else SimCache()
    most = workload.cells - max(workload.core_cells, 1)
    return [(r, c.simulate(workload, "async", seed, rollout_cells=r)) for r in range(1, most + 1)]


def best_static(workload: Workload, seed: int = 0, cache: SimCache | None = None) -> tuple[int, SimResult]:
    """The static rollout/train split with the shortest wall time (ties: fewer rollout cells)."""
    return min(static_splits(workload, seed, cache), key=lambda x: (x[1].wall_s, x[0]))


def half_split(cells: int) -> int:
    """Rollout cells of the default (half/half) Async policy on ``cells`` cells."""
    ids = [str(i) for i in range(cells)]
    return sum(1 for role in load_policy("async").initial_assignment(ids).values() if role == "rollout")


def compare(workload: Workload, seed: int = 0, cache: SimCache | None = None) -> Comparison:
    """Elastic, Colocate, half/half and the best split on one workload and seed. The half/half run is the
    static split of ``half_split(cells)`` rollout cells when that split is among those searched (same run)."""
    c = cache if cache is not None else SimCache()
    splits = static_splits(workload, seed, c)
    r, static = min(splits, key=lambda x: (x[1].wall_s, x[0]))
    by_cells = dict(splits)
    half = by_cells.get(half_split(workload.cells)) or c.simulate(workload, "async", seed)
    return Comparison(
        elastic=c.simulate(workload, "elastic", seed),
        colocate=c.simulate(workload, "colocate", seed),
        async_half=half,
        best_static=static,
        best_static_rollout_cells=r,
    )


def sweep(
    workload: Workload,
    field: str,
    values: Sequence[float],
    seeds: Sequence[int] = (0,),
    transform: Callable[[Workload, float], Workload] | None = None,
    cache: SimCache | None = None,
) -> list[dict[str, object]]:
    """Speed-ups of Elastic over Colocate, over Async at its best static split (re-tuned at every value and
    seed) and over the half/half split, as ``field`` takes ``values``. Each row: the means over ``seeds``
    under the ratio names, ``per_seed`` ratios, the best split per seed and seed ``seeds[0]``'s wall hours."""
    c = cache if cache is not None else SimCache()
    rows: list[dict[str, object]] = []
    for v in values:
        w = transform(workload, v) if transform else workload.with_(**{field: v})
        cmps = [compare(w, s, c) for s in seeds]
        per_seed = [cmp.ratios() for cmp in cmps]
        means = {k: round(statistics.fmean(p[k] for p in per_seed), 4) for k in per_seed[0]}
        rows.append({
            field: v,
            **means,
            "per_seed": {k: [p[k] for p in per_seed] for k in per_seed[0]},
            "best_static_rollout_cells": [cmp.best_static_rollout_cells for cmp in cmps],
            "wall_h_first_seed": cmps[0].wall_h(),
        })
    return rows


def train_ratio(workload: Workload, ratio: float) -> Workload:
    """Set the training cost so one step on the whole cluster takes ``ratio`` × the median rollout."""
    return workload.with_(train_cell_s_per_step=ratio * workload.rollout_p50_s * workload.cells)
