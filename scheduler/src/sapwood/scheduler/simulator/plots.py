"""PNG plots of simulation results (matplotlib, Agg backend)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from sapwood.scheduler.simulator.results import SimResult


def _save(fig: Any, ax: Any, path: Path, legend_loc: str = "best") -> Path:
    ax.legend(loc=legend_loc, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_roles(result: SimResult, path: Path) -> Path:
    """Cells per role over time (stacked steps)."""
    t = [row[0] / 3600.0 for row in result.timeline] + [result.wall_s / 3600.0]
    fig, ax = plt.subplots(figsize=(10, 3.5))
    labels = ("rollout", "train", "idle", "switching")
    series = [[row[i + 1] for row in result.timeline] for i in range(4)]
    series = [[*s, s[-1]] for s in series]
    ax.stackplot(t, *series, labels=labels, step="post")
    ax.set_xlabel("hours")
    ax.set_ylabel("cells")
    ax.set_title(f"{result.policy}: cell roles over time ({result.steps} steps, {result.wall_s / 3600:.1f} h)")
    return _save(fig, ax, path, "upper right")


def plot_idle(results: Sequence[SimResult], path: Path) -> Path:
    """Idle fraction of rollout and train cell-seconds per policy."""
    fig, ax = plt.subplots(figsize=(6, 3.5))
    names = [r.policy for r in results]
    x = range(len(results))
    ax.bar([i - 0.2 for i in x], [r.idle_fraction["rollout"] for r in results], 0.4, label="rollout idle")
    ax.bar([i + 0.2 for i in x], [r.idle_fraction["train"] for r in results], 0.4, label="train idle")
    ax.set_xticks(list(x), names)
    ax.set_ylabel("idle fraction")
    return _save(fig, ax, path)


def plot_sweep(
    rows: Sequence[Mapping[str, Any]],
    field: str,
    path: Path,
    log_x: bool = False,
    streaming: Sequence[Mapping[str, Any]] | None = None,
) -> Path:
    """Speed-up of Elastic over Colocate, the best static split and the half/half split against one parameter;
    with ``streaming`` rows (the same sweep with streaming accumulation) a second panel beside the first."""
    panels = [("no streaming accumulation", rows)] + ([("streaming accumulation", streaming)] if streaming else [])
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 3.8), sharey=True, squeeze=False)
    for ax, (title, rs) in zip(axes[0], panels, strict=True):
        xs = [r[field] for r in rs]
        ax.plot(xs, [r["elastic_vs_colocate"] for r in rs], "o-", label="elastic vs colocate")
        ax.plot(xs, [r["elastic_vs_best_static"] for r in rs], "s-", label="elastic vs best static split")
        ax.plot(xs, [r["elastic_vs_async_half"] for r in rs], "^--", label="elastic vs half/half")
        ax.axhline(1.0, color="grey", lw=0.8)
        if log_x:
            ax.set_xscale("log")
        ax.set_xlabel(field)
        ax.set_title(title, fontsize=9)
        ax.legend(loc="best", fontsize=8)
    axes[0][0].set_ylabel("speed-up (wall-time ratio)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
