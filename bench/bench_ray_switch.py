"""Elastic runtime on Ray, on the CPU: switch time per phase, and the demo's elastic-vs-static wall time.

1. Switches with calls in flight: two cells (capacity 2) serve executions of the key-recall task; one
   cell is moved rollout → train → rollout ``--switches`` times with a grace period of 0 (every call in
   flight is aborted, its prefix recomputed on the other cell, and re-issued). Per phase: median and max
   seconds (drain, grace, abort, kv_handoff = the measured recompute, reroute, weight_load), and the
   calls lost / duplicated against the store (must be 0).
2. The elastic demo (``sapwood demo --elastic``'s code) with ``--executions`` per schedule, elastic
   against the static split (``async``) and colocated, same seeds: wall-time ratios.

    python bench/bench_ray_switch.py [--switches 6] [--executions 24] [--skip-demo]

The last stdout line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import ray
import torch
from rich.console import Console
from rich.table import Table

from sapwood.demo.config import DemoConfig
from sapwood.demo.elastic.driver import ElasticDemoConfig, run_elastic_demo
from sapwood.demo.elastic.executions import run_executions
from sapwood.demo.tasks import KeyRecallConfig, KeyRecallEnv
from sapwood.learner.model import TinyActorCritic
from sapwood.scheduler.runtime.cluster import CellSpec, ElasticRuntime, init_ray

console = Console(stderr=True)


def bench_switches(n_switches: int, out: Path) -> dict[str, Any]:
    task = KeyRecallConfig(max_turns=16, fork_prob=0.0)
    model_cfg = DemoConfig(task=task).model_config()
    torch.manual_seed(0)
    state = TinyActorCritic(model_cfg).state_dict()
    ckpt = out / "policy.pt"
    torch.save({"model": state}, ckpt)
    rt = ElasticRuntime(f"sqlite:///{out / 'switch.db'}", [CellSpec("c0"), CellSpec("c1")], model_cfg, state,
                        decode_delay_s=0.1, grace_s=0.0, policy_source=lambda: (1, str(ckpt)))
    env = KeyRecallEnv(task)
    rng = np.random.default_rng(0)
    tasks = [env.sample_task(rng, task_id=f"t{i}") for i in range(4 * n_switches)]
    outcomes: list[Any] = []
    runner = threading.Thread(target=lambda: outcomes.extend(run_executions(
        tasks, task, rt.router, rt.writer, run_id="bench", seed=0, concurrency=4)), daemon=True)
    try:
        runner.start()
        reports = []
        for i in range(2 * n_switches):
            deadline = time.monotonic() + 30
            while i % 2 == 0 and ray.get(rt.cells["c0"].status.remote())["in_flight"] == 0:
                if time.monotonic() > deadline or not runner.is_alive():
                    break
                time.sleep(0.005)
            reports.append(rt.assign("c0", "train" if i % 2 == 0 else "rollout", reason="bench"))
            time.sleep(0.3)
        runner.join(timeout=600)
        in_store = {eid: counts.calls for eid, counts in rt.call_counts().items()}
        lost = sum(max(o.calls - in_store.get(o.execution_id, 0), 0) for o in outcomes)
        dup = sum(max(in_store.get(o.execution_id, 0) - o.calls, 0) for o in outcomes)
        router = ray.get(rt.router.stats.remote())
    finally:
        rt.shutdown()
    phases: dict[str, list[float]] = {}
    for r in reports:
        for k, v in r.phases.items():
            phases.setdefault(k, []).append(v)
    return {
        "switches": len(reports), "aborted_calls": sum(r.aborted_calls for r in reports),
        "phases_median_s": {k: round(statistics.median(v), 5) for k, v in phases.items()},
        "phases_max_s": {k: round(max(v), 5) for k, v in phases.items()},
        "switch_total_median_s": round(statistics.median(r.total_s for r in reports), 5),
        "calls_rerouted": router["rerouted"], "calls_lost": lost, "calls_duplicated": dup,
        "envs_reset": sum(max(o.resets - 1, 0) for o in outcomes), "executions": len(outcomes),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--switches", type=int, default=6)
    ap.add_argument("--executions", type=int, default=24)
    ap.add_argument("--skip-demo", action="store_true")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="bench-ray-switch-"))
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    init_ray(None)
    result: dict[str, Any] = {"bench": "ray_switch", "switch": bench_switches(args.switches, out)}
    sw = result["switch"]
    table = Table(title=f"switch phases, {sw['switches']} switches, {sw['aborted_calls']} calls aborted")
    for col in ("phase", "median ms", "max ms"):
        table.add_column(col, justify="right")
    for k, v in sw["phases_median_s"].items():
        table.add_row(k, f"{v * 1e3:.1f}", f"{sw['phases_max_s'][k] * 1e3:.1f}")
    console.print(table)
    if not args.skip_demo:
        demo = run_elastic_demo(ElasticDemoConfig(executions=args.executions, eval_executions=0,
                                                  out_dir=out / "demo"))
        result["demo"] = {name: {k: s[k] for k in ("wall_s", "steps", "switches", "calls_lost", "calls_duplicated",
                                                   "envs_reset")} for name, s in demo["schedules"].items()}
        for key in ("wall_async_over_elastic", "wall_colocate_over_elastic"):
            result[key] = demo.get(key)
        console.print(f"wall time: static/elastic {result['wall_async_over_elastic']}, "
                      f"colocated/elastic {result['wall_colocate_over_elastic']}")
    ray.shutdown()
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
