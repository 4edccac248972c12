"""PNG plots of a demo run (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["plot_lag", "plot_reward"]


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _rolling(values: Sequence[float], window: int) -> np.ndarray:
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        return x
    c = np.cumsum(np.insert(x, 0, 0.0))
    idx = np.arange(1, x.size + 1)
    lo = np.maximum(0, idx - window)
    return (c[idx] - c[lo]) / (idx - lo)


def plot_reward(
    path: Path,
    steps: Sequence[float],
    batch_rewards: Sequence[float],
    *,
    rollout_rewards: Sequence[float] = (),
    eval_start: float | None = None,
    eval_end: float | None = None,
    title: str = "",
    window: int = 10,
) -> Path:
    """Reward vs learner step: each batch's mean reward, its rolling mean, and the evaluations.

    ``rollout_rewards`` (in finishing order) are drawn against a second, top axis.
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    if len(steps):
        ax.scatter(steps, batch_rewards, s=6, alpha=0.3, label="batch mean reward")
        ax.plot(steps, _rolling(batch_rewards, window), lw=2, label=f"rolling mean ({window} steps)")
    if eval_start is not None:
        ax.axhline(eval_start, color="grey", ls="--", label=f"eval at start {eval_start:.3f}")
    if eval_end is not None:
        ax.axhline(eval_end, color="green", ls="--", label=f"eval at end {eval_end:.3f}")
    ax.set_xlabel("learner step (policy version)")
    ax.set_ylabel("reward (fraction of key slots correct)")
    ax.set_ylim(0, 1)
    if len(rollout_rewards):
        top = ax.twiny()
        top.plot(np.arange(len(rollout_rewards)), _rolling(rollout_rewards, 50), color="purple", alpha=0.6, lw=1)
        top.set_xlabel("rollout executions (purple: rolling mean of 50)")
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title(title or "Reward during asynchronous training")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_lag(path: Path, timeline: Sequence[dict[str, float]], *, title: str = "") -> Path:
    """Backlog, ingest lag and policy staleness over wall-clock time."""
    plt = _pyplot()
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(8, 5.5), sharex=True)
    t = [row["t"] for row in timeline]
    ax1.plot(t, [row["backlog"] for row in timeline], label="trainer backlog (finished, untrained executions)")
    ax1.plot(t, [row["in_flight"] for row in timeline], label="in-flight executions")
    if any(row.get("ingest_lag", 0) for row in timeline):
        ax1.plot(t, [row["ingest_lag"] for row in timeline], label="Kafka ingest lag (records)")
    ax1.set_ylabel("count")
    ax1.legend(fontsize=8, loc="upper right")
    ax2.plot(t, [row["staleness_mean"] for row in timeline], label="mean staleness of trained tokens")
    ax2.plot(t, [row["staleness_max"] for row in timeline], label="max staleness", alpha=0.6)
    ax2.set_ylabel("policy versions behind")
    ax2.set_xlabel("seconds since rollouts started")
    ax2.legend(fontsize=8, loc="upper right")
    fig.suptitle(title or "Lag and backlog")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
