"""Elastic scheduler: the QwenGyre claim in simulation, where the gain comes from, and decision latency.

1. ``paper`` preset (see ``sapwood.scheduler.simulator.workload.PAPER`` for every assumption): wall time
   of 48 steps under Elastic, Colocate, Async (half/half split) and the best static split, over seeds.
   The source reports 1.85× over Colocate and 1.78× over Async; the preset is derived, not tuned.
2. Sweeps on the paper preset (fewer steps): tail heaviness p99/p50 1 … 20, switch cost 1 s … 10 min,
   training/rollout cost ratio; PNG plots of each and of the paper run's cell roles.
3. Decision latency (live signals read + policy) on a PostgreSQL store of ≥ 1M tokens and, when Kafka is
   reachable, a topic of ≥ 4 partitions (target p99 ≤ 50 ms): ``bench/bench_decision_latency.py``.

    python bench/bench_scheduler.py [--seeds 3] [--sweep-steps 16] [--ticks 200] [--out bench-out/scheduler]

The admin URL comes from ``--admin-url``, ``SAPWOOD_BENCH_DATABASE_URL`` or ``SAPWOOD_TEST_DATABASE_URL``;
Kafka from ``--bootstrap``, ``SAPWOOD_KAFKA_BOOTSTRAP`` or ``SAPWOOD_TEST_KAFKA_BOOTSTRAP``. The last stdout
line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from bench_decision_latency import latency  # decision latency: its own bench, also run here
from sapwood.scheduler.simulator import preset, simulate
from sapwood.scheduler.simulator.plots import plot_idle, plot_roles, plot_sweep
from sapwood.scheduler.simulator.sweep import best_static, sweep, train_ratio

console = Console(stderr=True)


def log(msg: str) -> None:
    print(f"[bench_scheduler] {msg}", file=sys.stderr, flush=True)


def paper_claim(seeds: int, out: Path) -> dict[str, Any]:
    w = preset("paper")
    rows = []
    with Progress(console=console) as progress:
        task = progress.add_task("paper preset", total=seeds * 3 + w.cells - 1)
        for seed in range(seeds):
            r = {}
            for name in ("elastic", "colocate", "async"):
                r[name] = simulate(w, name, seed)
                progress.advance(task)
            rows.append(r)
        runs_static = []
        for k in range(1, w.cells):
            runs_static.append((k, simulate(w, "async", 0, rollout_cells=k)))
            progress.advance(task)
    k_best, static = min(runs_static, key=lambda x: x[1].wall_s)
    plot_roles(rows[0]["elastic"], out / "paper_roles_elastic.png")
    plot_roles(rows[0]["colocate"], out / "paper_roles_colocate.png")
    plot_roles(rows[0]["async"], out / "paper_roles_async.png")
    plot_idle([rows[0]["elastic"], rows[0]["colocate"], rows[0]["async"], static], out / "paper_idle.png")
    vs_c = [r["colocate"].wall_s / r["elastic"].wall_s for r in rows]
    vs_a = [r["async"].wall_s / r["elastic"].wall_s for r in rows]
    table = Table(title="paper preset, seed 0 (source: 75.42 h elastic, 134.55 h async, 1.85× / 1.78×)")
    for col in ("policy", "wall h", "idle rollout", "idle train", "switches", "staleness mean/max"):
        table.add_column(col, justify="right")
    for name, res in [*rows[0].items(), (f"static {k_best}/{w.cells - k_best}", static)]:
        s = res.summary()
        table.add_row(name, f"{s['wall_h']:.1f}", f"{s['idle_rollout']:.3f}", f"{s['idle_train']:.3f}",
                      str(s["switches"]), f"{s['staleness_mean']:.2f}/{s['staleness_max']}")
    console.print(table)
    return {
        "workload": w.to_json(),
        "seeds": seeds,
        "elastic_vs_colocate": round(statistics.fmean(vs_c), 4),
        "elastic_vs_async": round(statistics.fmean(vs_a), 4),
        "elastic_vs_colocate_per_seed": [round(x, 4) for x in vs_c],
        "elastic_vs_async_per_seed": [round(x, 4) for x in vs_a],
        "elastic_vs_best_static": round(static.wall_s / rows[0]["elastic"].wall_s, 4),
        "best_static_rollout_cells": k_best,
        "wall_h_seed0": {name: round(res.wall_s / 3600, 2) for name, res in rows[0].items()}
        | {"best_static": round(static.wall_s / 3600, 2)},
        "lower_bound_h": round(work_bound_s(w) / 3600, 2),
        "summary_seed0": {name: res.summary() for name, res in rows[0].items()},
    }


def work_bound_s(w: Any) -> float:
    """No policy beats this: every cell busy all the time on the expected rollout + training work."""
    mean_d = w.rollout_p50_s * float(np.exp(w.sigma ** 2 / 2))
    per_step = w.batch_size * mean_d / w.slots_per_cell + w.train_cell_s_per_step
    return w.steps * per_step / w.cells


def sweeps(steps: int, out: Path) -> dict[str, Any]:
    w = preset("paper").with_(steps=steps)
    with Progress(console=console) as progress:
        task = progress.add_task("sweeps", total=3)
        tail = sweep(w, "tail_ratio", [1.0, 2.0, 4.0, 8.0, 12.0, 20.0])
        progress.advance(task)
        switch = sweep(w, "switch_cost_s", [1.0, 10.0, 60.0, 300.0, 600.0])
        progress.advance(task)
        ratio = sweep(w, "train_ratio", [0.1, 0.25, 0.5, 1.0, 2.0], transform=train_ratio)
        progress.advance(task)
    plot_sweep(tail, "tail_ratio", out / "sweep_tail_ratio.png")
    plot_sweep(switch, "switch_cost_s", out / "sweep_switch_cost.png", log_x=True)
    plot_sweep(ratio, "train_ratio", out / "sweep_train_ratio.png", log_x=True)
    _, static = best_static(w.with_(tail_ratio=1.0))
    zero_var = simulate(w.with_(tail_ratio=1.0), "elastic")
    return {"steps": steps, "tail_ratio": tail, "switch_cost_s": switch, "train_over_rollout": ratio,
            "zero_variance_elastic_vs_best_static": round(static.wall_s / zero_var.wall_s, 4)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--sweep-steps", type=int, default=16)
    p.add_argument("--ticks", type=int, default=200)
    p.add_argument("--executions", type=int, default=2, help="~700K-token synthetic executions in the store")
    p.add_argument("--admin-url", default=os.environ.get("SAPWOOD_BENCH_DATABASE_URL")
                   or os.environ.get("SAPWOOD_TEST_DATABASE_URL"))
    p.add_argument("--bootstrap", default=os.environ.get("SAPWOOD_KAFKA_BOOTSTRAP")
                   or os.environ.get("SAPWOOD_TEST_KAFKA_BOOTSTRAP"))
    p.add_argument("--out", type=Path, default=Path("bench-out/scheduler"))
    p.add_argument("--skip-latency", action="store_true")
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    result: dict[str, Any] = {"bench": "scheduler", "source": {"elastic_vs_colocate": 1.85, "elastic_vs_async": 1.78}}
    result["paper"] = paper_claim(a.seeds, a.out)
    result["elastic_vs_colocate"] = result["paper"]["elastic_vs_colocate"]
    result["elastic_vs_async"] = result["paper"]["elastic_vs_async"]
    result["sweep"] = sweeps(a.sweep_steps, a.out)
    if a.skip_latency or not a.admin_url:
        result["decision_latency"] = {"skipped": "no PostgreSQL admin URL" if not a.admin_url else "--skip-latency"}
    else:
        result["decision_latency"] = latency(a.admin_url, a.bootstrap, a.executions, a.ticks)
    result["plots"] = sorted(str(x) for x in a.out.glob("*.png"))
    result["seconds"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
