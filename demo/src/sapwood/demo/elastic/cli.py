"""The ``--elastic`` branch of ``sapwood demo``: progress, a table per schedule, one JSON line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

ROWS = (("wall_s", "wall time (s)"), ("steps", "training steps"), ("switches", "switches"),
        ("calls_rerouted", "calls re-routed"), ("calls_left_sticky_cell", "calls that left a full sticky cell"),
        ("envs_reset", "environments reset"),
        ("calls_lost", "calls lost (store)"), ("calls_duplicated", "calls duplicated (store)"),
        ("executions_error", "executions ended error"), ("eval_reward_end", "eval reward at the end"))


def elastic_demo(*, seed: int, cells: int, executions: int, out_dir: Path | None, quiet: bool,
                 ray_address: str | None, console: Console, staleness_bound: int = 1,
                 compare_seeds: int | None = None, learner_backend: str = "torch",
                 compare_reference: bool = False) -> None:
    """Run every schedule on the same seeds and print the comparison (the JSON line last); with
    ``compare_seeds``, the live comparison on seeds ``seed`` … ``seed + compare_seeds − 1`` (the synchronous
    colocate as a reference arm too with ``compare_reference``)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from sapwood.demo.elastic.driver import ElasticDemoConfig, run_elastic_demo

    if cells < 2 or executions < 1:
        raise typer.BadParameter(f"--elastic needs --cells ≥ 2 and --elastic-executions ≥ 1, got {cells}, "
                                 f"{executions}")
    if staleness_bound not in (0, 1):
        raise typer.BadParameter(f"--staleness-bound must be 0 or 1 (the long-tail workload's bounds), got "
                                 f"{staleness_bound}")
    if compare_seeds is not None and compare_seeds < 1:
        raise typer.BadParameter(f"--compare-seeds must be ≥ 1 (the goals need 3), got {compare_seeds}")
    from sapwood.learner.backends import BACKENDS

    if learner_backend not in BACKENDS:
        raise typer.BadParameter(f"--backend must be one of {', '.join(BACKENDS)}, got {learner_backend!r}")
    cfg = ElasticDemoConfig(seed=seed, cells=cells, executions=executions, out_dir=out_dir,
                            staleness_bound=staleness_bound, learner_backend=learner_backend)
    progress = None if quiet else Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                           TimeElapsedColumn(), console=console)
    bars: dict[str, Any] = {}

    def on_tick(schedule: str, done: int, total: int) -> None:
        if progress is None:
            return
        if schedule not in bars:
            bars[schedule] = progress.add_task(f"{schedule}: executions trained", total=total)
        progress.update(bars[schedule], completed=done)

    if progress is not None:
        progress.start()
    try:
        if compare_seeds is not None:
            from sapwood.demo.elastic.compare import run_compare

            summary = run_compare(cfg, list(range(seed, seed + compare_seeds)), on_tick=on_tick,
                                  ray_address=ray_address, reference=compare_reference)
        else:
            summary = run_elastic_demo(cfg, on_tick=on_tick, ray_address=ray_address)
    finally:
        if progress is not None:
            progress.stop()
    if compare_seeds is not None:
        if not quiet:
            _print_compare(summary, console)
        print(json.dumps(summary), flush=True)
        return
    if not quiet:
        table = Table(title=f"sapwood demo --elastic (seed {seed}, {cells} cells, eval reward at the start "
                            f"{summary['eval_reward_start']:.3f})")
        table.add_column("")
        names = list(summary["schedules"])
        for n in names:
            table.add_column(n, justify="right")
        for key, label in ROWS:
            table.add_row(label, *[_fmt(summary["schedules"][n].get(key)) for n in names])
        console.print(table)
        for n in names:
            phases = summary["schedules"][n]["switch_phase_mean_s"]
            if phases:
                shown = ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in phases.items())
                console.print(f"{n}: mean switch phases {shown}")
        for p in summary["plots"]:
            console.print(f"plot: {p}")
    print(json.dumps(summary), flush=True)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3f}"
    return "-" if v is None else str(v)


def _print_compare(summary: dict[str, Any], console: Console) -> None:
    """One row per seed and schedule (wall, occupancies, switches), then live ratios beside the simulator's."""
    from sapwood.demo.elastic.compare import GOALS, REFERENCE

    table = Table(title="sapwood demo --elastic --compare: wall seconds, slot / train-cell occupancy, switches")
    for col in ("seed", "schedule", "wall (s)", "slot occ.", "train-cell occ.", "switches", "switch cell-s",
                "eval reward end", "simulated wall (s)", "simulated switches"):
        table.add_column(col, justify="right")
    for row in summary["seeds"]:
        for name, wall in row["wall_s"].items():
            occ = row["occupancy"][name]
            mark = " (best static)" if name == row["best_static"] else ""
            table.add_row(str(row["seed"]), name + mark, _fmt(wall), _fmt(occ["slot_occupancy"]),
                          _fmt(occ["train_cell_occupancy"]), _fmt(occ["switches"]), _fmt(occ["switch_overhead_cell_s"]),
                          _fmt(row["eval_reward_end"][name]), _fmt(row["simulator"]["wall_s"][name]),
                          _fmt(row["simulator"]["switches"][name]))
    console.print(table)
    ratios = Table(title="elastic's speed-up (geometric mean over the seeds): live vs the calibrated simulator")
    for col in ("ratio", "live", "simulator", "simulator error", "goal", "met"):
        ratios.add_column(col, justify="right")
    for key, label in (("elastic_over_best_static", "best static / elastic"),
                       ("elastic_over_colocate", "colocate / elastic")):
        goal = GOALS[key]
        ratios.add_row(label, f"{summary[key]:.3f}", f"{summary['simulator_' + key]:.3f}",
                       f"{summary['simulator_error'][key]:+.1%}", f"≥ {goal}", str(summary["goals"][key]))
    if REFERENCE in summary:  # the synchronous colocate, for reference: no goal
        ratios.add_row("colocate-sync / elastic (reference)", f"{summary[REFERENCE]:.3f}",
                       f"{summary['simulator_' + REFERENCE]:.3f}", f"{summary['reference_simulator_error']:+.1%}",
                       "-", "-")
    console.print(ratios)
    console.print("goals: " + ", ".join(f"{k} {'met' if v else 'NOT met'}" for k, v in summary["goals"].items()))
    for p in summary.get("plots", []):
        console.print(f"plot: {p}")
