"""Compare policies on one workload, find the best static split, and sweep the workload's knobs."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sapwood.scheduler.simulator.cluster import simulate
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


def static_splits(workload: Workload, seed: int = 0) -> list[tuple[int, SimResult]]:
    """Async at every static split: ``(rollout cells, result)`` for 1 … cells − core_cells rollout cells
    (the core cells are pinned to training, so no split gives them to rollout)."""
    most = workload.cells - max(workload.core_cells, 1)
    return [(r, simulate(workload, "async", seed, rollout_cells=r)) for r in range(1, most + 1)]


def best_static(workload: Workload, seed: int = 0) -> tuple[int, SimResult]:
    """The static rollout/train split with the shortest wall time (ties: fewer rollout cells)."""
    return min(static_splits(workload, seed), key=lambda x: (x[1].wall_s, x[0]))


def compare(workload: Workload, seed: int = 0) -> Comparison:
    r, static = best_static(workload, seed)
    return Comparison(
        elastic=simulate(workload, "elastic", seed),
        colocate=simulate(workload, "colocate", seed),
        async_half=simulate(workload, "async", seed),
        best_static=static,
        best_static_rollout_cells=r,
    )


def sweep(
    workload: Workload,
    field: str,
    values: Sequence[float],
    seed: int = 0,
    transform: Callable[[Workload, float], Workload] | None = None,
) -> list[dict[str, float]]:
    """Speed-ups of Elastic over Colocate, over Async at its best static split (re-tuned at every value) and
    over the half/half split, as ``field`` takes ``values``."""
    rows = []
    for v in values:
        w = transform(workload, v) if transform else workload.with_(**{field: v})
        cmp = compare(w, seed)
        rows.append({field: v, **cmp.ratios(), "best_static_rollout_cells": cmp.best_static_rollout_cells})
    return rows


def train_ratio(workload: Workload, ratio: float) -> Workload:
    """Set the training cost so one step on the whole cluster takes ``ratio`` × the median rollout."""
    return workload.with_(train_cell_s_per_step=ratio * workload.rollout_p50_s * workload.cells)
