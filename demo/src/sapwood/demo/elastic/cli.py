"""The ``--elastic`` branch of ``sapwood demo``: progress, a table per schedule, one JSON line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

ROWS = (("wall_s", "wall time (s)"), ("steps", "training steps"), ("switches", "switches"),
        ("calls_rerouted", "calls re-routed"), ("envs_reset", "environments reset"),
        ("calls_lost", "calls lost (store)"), ("calls_duplicated", "calls duplicated (store)"),
        ("executions_error", "executions ended error"), ("eval_reward_end", "eval reward at the end"))


def elastic_demo(*, seed: int, cells: int, executions: int, out_dir: Path | None, quiet: bool,
                 ray_address: str | None, console: Console, staleness_bound: int = 1) -> None:
    """Run every schedule on the same seeds and print the comparison (the JSON line last)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from sapwood.demo.elastic.driver import ElasticDemoConfig, run_elastic_demo

    if cells < 2 or executions < 1:
        raise typer.BadParameter(f"--elastic needs --cells ≥ 2 and --elastic-executions ≥ 1, got {cells}, "
                                 f"{executions}")
    if staleness_bound not in (0, 1):
        raise typer.BadParameter(f"--staleness-bound must be 0 or 1 (the long-tail workload's bounds), got "
                                 f"{staleness_bound}")
    cfg = ElasticDemoConfig(seed=seed, cells=cells, executions=executions, out_dir=out_dir,
                            staleness_bound=staleness_bound)
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
        summary = run_elastic_demo(cfg, on_tick=on_tick, ray_address=ray_address)
    finally:
        if progress is not None:
            progress.stop()
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
