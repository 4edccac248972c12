"""Plots of ``sapwood demo --elastic``: the role timeline of each schedule and the switch phase times."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

ROLE_COLOURS = {"rollout": "tab:blue", "train": "tab:orange", "idle": "lightgrey"}


def role_segments(timeline: list[tuple[float, dict[str, str]]], cell_id: str,
                  end_s: float) -> list[tuple[float, float, str]]:
    """``(start, end, role)`` runs of one cell's role over a tick timeline."""
    out: list[tuple[float, float, str]] = []
    for t, roles in timeline:
        role = roles[cell_id]
        if out and out[-1][2] == role:
            continue
        if out:
            out[-1] = (out[-1][0], t, out[-1][2])
        out.append((t, end_s, role))
    return out


def plot_elastic(results: dict[str, Any], out_dir: Path) -> list[Path]:
    """``roles.png`` (one row of bars per cell per schedule) and ``switch_phases.png`` (mean seconds)."""
    files = []
    fig, axes = plt.subplots(len(results), 1, figsize=(10, 1.2 + 1.1 * len(results)), squeeze=False)
    for ax, (name, res) in zip(axes[:, 0], results.items(), strict=True):
        cells = sorted(res.timeline[0][1]) if res.timeline else []
        for row, cid in enumerate(cells):
            for start, end, role in role_segments(res.timeline, cid, res.wall_s):
                ax.barh(row, end - start, left=start, color=ROLE_COLOURS[role], height=0.8)
        ax.set_yticks(range(len(cells)), cells)
        ax.set_title(f"{name}: {res.wall_s:.1f} s, {len(res.switches)} switches", fontsize=9)
        ax.set_xlim(0, max(r.wall_s for r in results.values()))
    axes[-1, 0].set_xlabel("seconds")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in ROLE_COLOURS.values()]
    fig.legend(handles, list(ROLE_COLOURS), loc="upper right", ncol=3, fontsize=8)
    fig.tight_layout()
    path = out_dir / "roles.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    files.append(path)
    phases: dict[str, list[float]] = {}
    for res in results.values():
        for sw in res.switches:
            for k, v in sw["phases"].items():
                phases.setdefault(k, []).append(v * 1e3)
    if phases:
        fig, ax = plt.subplots(figsize=(7, 3.2))
        names = list(phases)
        ax.bar(names, [sum(v) / len(v) for v in phases.values()], color="tab:green")
        ax.set_ylabel("mean ms per switch")
        ax.set_title("switch phases (all schedules)", fontsize=9)
        fig.tight_layout()
        path = out_dir / "switch_phases.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        files.append(path)
    return files


def plot_compare(summary: dict[str, Any], out_dir: Path) -> Path:
    """``compare.png``: per seed, elastic's wall-time ratio over the best static split and over colocate,
    live beside the simulator's prediction, with the goals as dashed lines; a third panel for the
    synchronous colocate (reference, no goal) where the summary has it."""
    seeds = summary["seeds"]
    keys: list[tuple[str, str, float | None]] = [("elastic_over_best_static", "best static split / elastic", 1.2),
                                                 ("elastic_over_colocate", "colocate / elastic", 1.3)]
    if "elastic_over_colocate_sync" in summary:
        keys.append(("elastic_over_colocate_sync", "colocate-sync / elastic (reference)", None))
    fig, axes = plt.subplots(1, len(keys), figsize=(5 * len(keys), 3.6), squeeze=False)
    x = list(range(len(seeds)))
    for ax, (key, title, goal) in zip(axes[0], keys, strict=True):
        ax.bar([i - 0.2 for i in x], [r[key] for r in seeds], width=0.4, label="live", color="tab:blue")
        ax.bar([i + 0.2 for i in x], [r["simulator"][key] for r in seeds], width=0.4, label="simulator",
               color="tab:grey")
        if goal is not None:
            ax.axhline(goal, color="tab:red", linestyle="--", linewidth=1, label=f"goal {goal}×")
        ax.axhline(1.0, color="black", linewidth=0.6)
        ax.set_xticks(x, [f"seed {r['seed']}\n({r['best_static']})" for r in seeds], fontsize=8)
        ax.set_title(f"{title}: live {summary[key]:.2f}×, simulator {summary['simulator_' + key]:.2f}×",
                     fontsize=9)
        ax.set_ylabel("wall-time ratio")
        ax.legend(fontsize=7)
    fig.tight_layout()
    path = out_dir / "compare.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
