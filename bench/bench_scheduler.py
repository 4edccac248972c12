"""Elastic scheduler: the QwenGyre claim in simulation, where the gain comes from, and decision latency.

1. ``paper`` preset (see ``sapwood.scheduler.simulator.workload.PAPER`` for every assumption) and the
   ``paper-fit`` preset (knobs fitted to the source's per-step times): wall time of 48 steps under Elastic,
   Colocate, Async at the best static split (re-tuned per seed) and half/half, over seeds; streaming
   accumulation for Elastic and Async as a second row (every seed). The source reports 1.85× over
   Colocate and 1.78× over Async.
2. Sweeps on the paper preset (16 steps, 2 seeds by default), each without and with streaming accumulation:
   tail heaviness p99/p50 1 … 20, switch cost 1 s … 10 min (join cost following it), training/rollout cost
   ratio, satellite join cost alone, core size 1 … 8; at every point and seed Async is re-tuned to its best
   split. PNG plots of each and of the paper run's cell roles.
3. Decision latency (live signals read + policy) on a PostgreSQL store of ≥ 1M tokens and, when Kafka is
   reachable, a topic of ≥ 4 partitions (target p99 ≤ 50 ms): ``bench/bench_decision_latency.py``.

    python bench/bench_scheduler.py [--seeds 3] [--sweep-steps 16] [--sweep-seeds 2] [--jobs 2] [--ticks 200]
        [--skip-claim] [--skip-sweeps] [--skip-latency] [--out bench-out/scheduler]

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
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from bench_decision_latency import latency  # decision latency: its own bench, also run here
from sapwood.scheduler.simulator import preset
from sapwood.scheduler.simulator.cache import SimCache
from sapwood.scheduler.simulator.plots import plot_idle, plot_roles, plot_sweep
from sapwood.scheduler.simulator.sweep import compare, sweep, train_ratio
from sapwood.scheduler.simulator.workload import PAPER_FIT_ASYNC_ROLLOUT_CELLS

console = Console(stderr=True)


def log(msg: str) -> None:
    print(f"[bench_scheduler] {msg}", file=sys.stderr, flush=True)


def claim(name: str, seeds: int, out: Path | None, split: int | None = None) -> dict[str, Any]:
    """Elastic vs Colocate, vs the best static split (re-tuned per seed) and vs half/half on one preset;
    the same with streaming accumulation for Elastic and Async as a second row (every seed)."""
    w = preset(name)
    ws = w.with_(streaming_accumulation=True)
    cache = SimCache()
    per_seed, streamed = [], []
    with Progress(console=console) as progress:
        task = progress.add_task(f"{name} preset", total=seeds)
        for seed in range(seeds):
            cmp = compare(w, seed, cache)
            r = {"elastic": cmp.elastic, "colocate": cmp.colocate, "async_half": cmp.async_half,
                 "best_static": cmp.best_static}
            if split is not None:
                r["async_fitted_split"] = cache.simulate(w, "async", seed, rollout_cells=split)
            per_seed.append((cmp.best_static_rollout_cells, r))
            streamed.append(compare(ws, seed, cache))
            progress.advance(task)
    e = [r["elastic"].wall_s for _, r in per_seed]

    def ratio(key: str) -> dict[str, Any]:
        xs = [r[key].wall_s / ew for (_, r), ew in zip(per_seed, e, strict=True)]
        return {"mean": round(statistics.fmean(xs), 4), "per_seed": [round(x, 4) for x in xs]}

    def mean_of(xs: list[float]) -> dict[str, Any]:
        return {"mean": round(statistics.fmean(xs), 4), "per_seed": [round(x, 4) for x in xs]}

    keys = ["colocate", "best_static", "async_half"] + (["async_fitted_split"] if split is not None else [])
    r0 = per_seed[0][1]
    if out is not None:
        for key in ("elastic", "colocate", "best_static"):
            plot_roles(r0[key], out / f"{name}_roles_{key}.png")
        plot_idle(list(r0.values()), out / f"{name}_idle.png")
    table = Table(title=f"{name} preset, seed 0 (source: 75.42 h elastic, 134.55 h async)")
    for col in ("schedule", "wall h", "h/step", "idle rollout", "idle train", "switches", "staleness mean/max"):
        table.add_column(col, justify="right")
    for key, res in r0.items():
        sm = res.summary()
        table.add_row(key, f"{sm['wall_h']:.1f}", f"{sm['wall_h'] / w.steps:.2f}", f"{sm['idle_rollout']:.3f}",
                      f"{sm['idle_train']:.3f}", str(sm["switches"]),
                      f"{sm['staleness_mean']:.2f}/{sm['staleness_max']}")
    console.print(table)
    plain_e = [r["elastic"].wall_s for _, r in per_seed]
    plain_b = [r["best_static"].wall_s for _, r in per_seed]
    return {
        "workload": w.to_json(),
        "seeds": seeds,
        **{f"elastic_vs_{key}": ratio(key) for key in keys},
        "best_static_rollout_cells_per_seed": [k for k, _ in per_seed],
        "wall_h_seed0": {key: round(res.wall_s / 3600, 2) for key, res in r0.items()},
        "per_step_h_seed0": {key: round(res.wall_s / 3600 / w.steps, 3) for key, res in r0.items()},
        "lower_bound_h": round(work_bound_s(w) / 3600, 2),
        "streaming": {
            "elastic_vs_best_static": mean_of([c.best_static.wall_s / c.elastic.wall_s for c in streamed]),
            "elastic_vs_colocate": mean_of([c.colocate.wall_s / c.elastic.wall_s for c in streamed]),
            "elastic_vs_async_half": mean_of([c.async_half.wall_s / c.elastic.wall_s for c in streamed]),
            "best_static_rollout_cells_per_seed": [c.best_static_rollout_cells for c in streamed],
            "elastic_gain_from_streaming": mean_of([p / c.elastic.wall_s for p, c in zip(plain_e, streamed,
                                                                                           strict=True)]),
            "best_static_gain_from_streaming": mean_of([p / c.best_static.wall_s for p, c in zip(plain_b, streamed,
                                                                                                   strict=True)]),
            "wall_h_seed0": streamed[0].wall_h(),
        },
        "simulations_run": cache.runs,
        "simulations_reused": cache.hits,
        "summary_seed0": {key: res.summary() for key, res in r0.items()},
    }


def work_bound_s(w: Any) -> float:
    """No policy beats this: every cell busy all the time on the expected rollout + training work."""
    mean_d = w.rollout_p50_s * float(np.exp(w.sigma ** 2 / 2))
    per_step = w.batch_size * mean_d / w.slots_per_cell + w.train_cell_s_per_step
    return w.steps * per_step / w.cells


#: The sweeps on the paper preset: name -> (workload field, values, transform or None, log-scale x axis).
SWEEPS: dict[str, tuple[str, list[float], Any, bool]] = {
    "tail_ratio": ("tail_ratio", [1.0, 2.0, 4.0, 8.0, 12.0, 20.0], None, False),
    "switch_cost_s": ("switch_cost_s", [1.0, 10.0, 60.0, 300.0, 600.0], None, True),
    "train_over_rollout": ("train_ratio", [0.1, 0.25, 0.5, 1.0, 2.0], train_ratio, True),
    "join_cost_s": ("join_cost_s", [1.0, 10.0, 60.0, 300.0, 600.0], None, True),
    "core_cells": ("core_cells", [1, 2, 3, 4, 6, 8], None, False),
}


def one_sweep(name: str, mode: str, steps: int, seeds: int, out: Path) -> dict[str, Any]:
    """One sweep, ``mode`` "plain" or "streaming" (streaming accumulation on); also written to
    ``out/sweep_<name>_<mode>.json`` as soon as it is done."""
    field, values, transform, _ = SWEEPS[name]
    w = preset("paper").with_(steps=steps, streaming_accumulation=mode == "streaming")
    cache = SimCache()
    t0 = time.perf_counter()
    rows = sweep(w, field, values, tuple(range(seeds)), transform, cache)
    result = {"field": field, "mode": mode, "rows": rows, "simulations_run": cache.runs,
              "simulations_reused": cache.hits, "seconds": round(time.perf_counter() - t0, 1)}
    (out / f"sweep_{name}_{mode}.json").write_text(json.dumps(result))
    return result


def sweeps(steps: int, seeds: int, jobs: int, out: Path) -> dict[str, Any]:
    """Every sweep in ``SWEEPS`` without and with streaming, ``jobs`` at a time in worker processes; one PNG
    per sweep (both modes side by side)."""
    result: dict[str, Any] = {"steps": steps, "seeds": seeds, "jobs": jobs}
    t0 = time.perf_counter()
    tasks = [(name, mode) for mode in ("plain", "streaming") for name in SWEEPS]
    runs: dict[tuple[str, str], dict[str, Any]] = {}
    with ProcessPoolExecutor(max_workers=jobs) as pool, Progress(console=console) as progress:
        task = progress.add_task("sweeps", total=len(tasks))
        futures = {pool.submit(one_sweep, name, mode, steps, seeds, out): (name, mode) for name, mode in tasks}
        for fut in as_completed(futures):
            runs[futures[fut]] = r = fut.result()
            log(f"sweep {futures[fut]}: {r['seconds']} s, {r['simulations_run']} simulations")
            progress.advance(task)
    for name, (field, _, _, log_x) in SWEEPS.items():
        plain, streaming = runs[(name, "plain")], runs[(name, "streaming")]
        result[name] = {"field": field, "plain": plain["rows"], "streaming": streaming["rows"],
                        "simulations_run": plain["simulations_run"] + streaming["simulations_run"],
                        "simulations_reused": plain["simulations_reused"] + streaming["simulations_reused"],
                        "seconds": round(plain["seconds"] + streaming["seconds"], 1)}
        plot_sweep(plain["rows"], field, out / f"sweep_{name}.png", log_x=log_x, streaming=streaming["rows"])
    result["seconds"] = round(time.perf_counter() - t0, 1)
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--sweep-steps", type=int, default=16, help="steps per sweep run (the headline runs 48)")
    p.add_argument("--sweep-seeds", type=int, default=2, help="seeds per sweep point (each re-tunes the split)")
    p.add_argument("--jobs", type=int, default=2, help="sweeps run at a time, one worker process each")
    p.add_argument("--skip-claim", action="store_true", help="only the sweeps (and latency): no headline runs")
    p.add_argument("--ticks", type=int, default=200)
    p.add_argument("--executions", type=int, default=2, help="~700K-token synthetic executions in the store")
    p.add_argument("--admin-url", default=os.environ.get("SAPWOOD_BENCH_DATABASE_URL")
                   or os.environ.get("SAPWOOD_TEST_DATABASE_URL"))
    p.add_argument("--bootstrap", default=os.environ.get("SAPWOOD_KAFKA_BOOTSTRAP")
                   or os.environ.get("SAPWOOD_TEST_KAFKA_BOOTSTRAP"))
    p.add_argument("--out", type=Path, default=Path("bench-out/scheduler"))
    p.add_argument("--skip-latency", action="store_true")
    p.add_argument("--skip-sweeps", action="store_true")
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    result: dict[str, Any] = {"bench": "scheduler", "source": {"elastic_vs_colocate": 1.85, "elastic_vs_async": 1.78}}
    if not a.skip_claim:
        result["paper"] = claim("paper", a.seeds, a.out)
        result["paper_fit"] = claim("paper-fit", a.seeds, a.out, split=PAPER_FIT_ASYNC_ROLLOUT_CELLS)
        for key in ("colocate", "best_static", "async_half"):
            result[f"elastic_vs_{key}"] = result["paper"][f"elastic_vs_{key}"]["mean"]
    result["sweep"] = (
        {"skipped": "--skip-sweeps"} if a.skip_sweeps else sweeps(a.sweep_steps, a.sweep_seeds, a.jobs, a.out)
    )
    if a.skip_latency or not a.admin_url:
        result["decision_latency"] = {"skipped": "no PostgreSQL admin URL" if not a.admin_url else "--skip-latency"}
    else:
        result["decision_latency"] = latency(a.admin_url, a.bootstrap, a.executions, a.ticks)
    result["plots"] = sorted(str(x) for x in a.out.glob("*.png"))
    result["seconds"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
