"""PNG of a training chaos campaign: evaluation reward per published version, with and without faults."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from sapwood.demo.plots import _pyplot

__all__ = ["plot_reward_curves"]


def plot_reward_curves(path: Path, chaos: Sequence[tuple[int, float]], clean: Sequence[tuple[int, float]],
                       kills: Sequence[tuple[int, str]]) -> Path:
    """Both runs' ``(version, evaluation reward)`` curves and a vertical mark at each death of the chaos run.

    ``kills``: ``(newest published version at the death, process kind)`` per death.
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 4.5))
    colours = {"worker": "tab:orange", "learner": "tab:red", "ingest": "tab:purple", "scheduler": "tab:brown"}
    seen: set[str] = set()
    for version, kind in kills:
        ax.axvline(version, color=colours.get(kind, "grey"), alpha=0.35, lw=0.8,
                   label=None if kind in seen else f"{kind} death")
        seen.add(kind)
    if clean:
        ax.plot(*zip(*clean, strict=True), lw=2, color="tab:green", label="no-fault run")
    if chaos:
        ax.plot(*zip(*chaos, strict=True), lw=2, color="tab:blue", label="chaos run (kill -9s and fault points)")
    ax.set_xlabel("published policy version")
    ax.set_ylabel("evaluation reward")
    ax.set_title("Training chaos campaign: evaluation reward per version")
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
