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
            "elastic_vs_async": round(self.async_half.wall_s / e, 4),
            "elastic_vs_best_static": round(self.best_static.wall_s / e, 4),
        }


def best_static(workload: Workload, seed: int = 0) -> tuple[int, SimResult]:
    """The static rollout/train split (1 … cells−1 rollout cells) with the shortest wall time."""
    runs = [(r, simulate(workload, "async", seed, rollout_cells=r)) for r in range(1, workload.cells)]
    return min(runs, key=lambda x: x[1].wall_s)


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
    """Speed-ups of Elastic over Colocate and the half/half Async split as ``field`` takes ``values``."""
    rows = []
    for v in values:
        w = transform(workload, v) if transform else workload.with_(**{field: v})
        e = simulate(w, "elastic", seed).wall_s
        rows.append(
            {
                field: v,
                "elastic_vs_colocate": round(simulate(w, "colocate", seed).wall_s / e, 4),
                "elastic_vs_async": round(simulate(w, "async", seed).wall_s / e, 4),
            }
        )
    return rows


def train_ratio(workload: Workload, ratio: float) -> Workload:
    """Set the training cost so one step on the whole cluster takes ``ratio`` × the median rollout."""
    return workload.with_(train_cell_s_per_step=ratio * workload.rollout_p50_s * workload.cells)
