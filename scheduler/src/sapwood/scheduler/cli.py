"""``sapwood scheduler ...``: simulate the cluster under a policy, or run the live scheduling loop."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

scheduler_app = typer.Typer(help="Elastic scheduler: cluster simulator and live loop.", no_args_is_help=True)
console = Console(stderr=True)


@scheduler_app.command("simulate")
def simulate_cmd(
    preset: Annotated[str, typer.Option(help="workload preset: paper, paper-fit or small")] = "paper",
    policies: Annotated[str, typer.Option(help="comma-separated policies (built-in names or import paths)")] = (
        "elastic,colocate,async"
    ),
    seed: int = 0,
    steps: Annotated[int | None, typer.Option(help="override the preset's training steps")] = None,
    tail_ratio: Annotated[float | None, typer.Option(help="override p99/p50 of rollout durations")] = None,
    switch_cost_s: Annotated[float | None, typer.Option(help="override the role-switch duration")] = None,
    batch_rule: Annotated[str | None, typer.Option(help="exact or first_finished")] = None,
    stale_rollouts: Annotated[str | None, typer.Option(help="first_finished: drop or discount stale rollouts")] = None,
    timeout_factor: Annotated[float | None, typer.Option(help="rollout timeout in medians (inf: none)")] = None,
    core_cells: Annotated[int | None, typer.Option(help="core cells pinned to training")] = None,
    streaming: Annotated[bool | None, typer.Option(help="streaming gradient accumulation")] = None,
    join_cost_s: Annotated[float | None, typer.Option(help="seconds a move into training takes")] = None,
    best_split: Annotated[bool, typer.Option(help="also run Async at its best static split (all tried)")] = False,
    plots: Annotated[Path | None, typer.Option(help="write PNG plots into this directory")] = None,
) -> None:
    """Simulate the workload under each policy; print a table and one JSON line (speed-ups over elastic)."""
    try:
        from sapwood.scheduler.simulator import preset as get_preset
        from sapwood.scheduler.simulator import simulate
        from sapwood.scheduler.simulator.plots import plot_idle, plot_roles
        from sapwood.scheduler.simulator.sweep import best_static
    except ModuleNotFoundError as exc:
        if exc.name != "simpy":
            raise
        raise typer.BadParameter("the simulator needs SimPy: pip install 'sapwood[scheduler]'") from None

    try:
        w = get_preset(preset)
        overrides = {"steps": steps, "tail_ratio": tail_ratio, "switch_cost_s": switch_cost_s,
                     "batch_rule": batch_rule, "stale_rollouts": stale_rollouts, "timeout_factor": timeout_factor,
                     "core_cells": core_cells, "streaming_accumulation": streaming, "join_cost_s": join_cost_s}
        w = w.with_(**{k: v for k, v in overrides.items() if v is not None})
        results = [simulate(w, name.strip(), seed) for name in policies.split(",") if name.strip()]
        best = best_static(w, seed) if best_split else None
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    table = Table(title=f"preset {preset}: {w.cells} cells, batch {w.batch_size}, {w.steps} steps, seed {seed}")
    for col in ("policy", "wall h", "idle rollout", "idle train", "switches", "switch cell-h", "staleness mean/max"):
        table.add_column(col, justify="right")
    for r in results:
        s = r.summary()
        table.add_row(
            r.policy, f"{s['wall_h']:.2f}", f"{s['idle_rollout']:.3f}", f"{s['idle_train']:.3f}",
            str(s["switches"]), f"{s['switch_cell_h']:.2f}", f"{s['staleness_mean']:.2f}/{s['staleness_max']}",
        )
    if best is not None:
        sb = best[1].summary()
        table.add_row(f"async best split ({best[0]} rollout)", f"{sb['wall_h']:.2f}", f"{sb['idle_rollout']:.3f}",
                      f"{sb['idle_train']:.3f}", "0", "0.00", f"{sb['staleness_mean']:.2f}/{sb['staleness_max']}")
    console.print(table)
    out: dict[str, object] = {"preset": preset, "workload": w.to_json(), "results": [r.summary() for r in results]}
    by_name = {r.policy: r for r in results}
    if best is not None:
        out["best_static"] = {"rollout_cells": best[0], **best[1].summary()}
        if "elastic" in by_name:
            out["elastic_vs_best_static"] = round(best[1].wall_s / by_name["elastic"].wall_s, 4)
    if "elastic" in by_name:
        for other in ("colocate", "async"):
            if other in by_name:
                out[f"elastic_vs_{other}"] = round(by_name[other].wall_s / by_name["elastic"].wall_s, 4)
    if plots is not None:
        plots.mkdir(parents=True, exist_ok=True)
        files = [str(plot_roles(r, plots / f"roles_{r.policy}.png")) for r in results]
        files.append(str(plot_idle(results, plots / "idle_fractions.png")))
        out["plots"] = files
    print(json.dumps(out))


def register(app: typer.Typer) -> None:
    from sapwood.scheduler import live_loop_cli

    live_loop_cli.register(scheduler_app)
    app.add_typer(scheduler_app, name="scheduler")
