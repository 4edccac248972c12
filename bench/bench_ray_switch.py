"""Elastic runtime on Ray, on the CPU: switch time per phase, and the demo's elastic-vs-static wall time.

1. Switches with calls in flight: two cells (capacity 2) serve executions of the key-recall task; one
   cell is moved rollout → train → rollout ``--switches`` times with a grace period of 0 (every call in
   flight is aborted, its KV migrated or recomputed on the other cell, and continued there). Per phase:
   median and max seconds over the samples that did something (a phase that moved nothing is not
   recorded, see ``runtime/switch.py``; the count of samples is printed), the whole switch (the sum of
   its phases, which cover every RPC, and the driver-side wall time around them), the calls lost /
   duplicated against the store, and the executions' statuses as the supervisor saw them and as the
   store holds them. **Exits 1** when any execution ended in ``error``, any call was lost or duplicated,
   or a switch aborted calls that were not continued.
2. The elastic demo (``sapwood demo --elastic``'s code) with ``--executions`` per schedule, elastic
   against the static split (``async``) and colocated, same seeds: wall-time ratios.

    python bench/bench_ray_switch.py [--switches 6] [--executions 24] [--skip-demo]

The last stdout line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
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
from sapwood.scheduler.runtime.switch import SwitchReport

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
            if i % 2 == 0:  # hold c0's calls after 2 tokens so that the switch meets calls in flight
                ray.get(rt.cells["c0"].pause.remote(after_tokens=2))
                ray.get(rt.cells["c0"].wait_held.remote(1, 60.0))
            reports.append(rt.assign("c0", "train" if i % 2 == 0 else "rollout", reason="bench"))
            ray.get(rt.cells["c0"].resume.remote())
            time.sleep(0.3)
        runner.join(timeout=600)
        in_store = {eid: counts.calls for eid, counts in rt.call_counts().items()}
        lost = sum(max(o.calls - in_store.get(o.execution_id, 0), 0) for o in outcomes)
        dup = sum(max(in_store.get(o.execution_id, 0) - o.calls, 0) for o in outcomes)
        stored = rt.executions()
        router = ray.get(rt.router.stats.remote())
    finally:
        rt.shutdown()
    return {**phase_figures(reports), "calls_rerouted": router["rerouted"], "calls_continued": router["aborted"],
            "calls_lost": lost, "calls_duplicated": dup, "executions": len(outcomes),
            "envs_reset": sum(max(o.resets - 1, 0) for o in outcomes),
            "statuses": dict(Counter(o.status for o in outcomes)),
            "statuses_stored": dict(Counter(stored[o.execution_id].status if o.execution_id in stored else "missing"
                                            for o in outcomes)),
            "errors": [o.message for o in outcomes if o.status == "error"][:5]}


def phase_figures(reports: list[SwitchReport]) -> dict[str, Any]:
    """Median / max seconds and sample count per phase (only phases that ran are in a report), and the whole
    switch: the sum of its phases and its wall time."""
    phases: dict[str, list[float]] = {}
    for r in reports:
        for k, v in r.phases.items():
            phases.setdefault(k, []).append(v)
    return {
        "switches": len(reports), "aborted_calls": sum(r.aborted_calls for r in reports),
        "aborting_switches": sum(r.aborted_calls > 0 for r in reports),
        "phases_samples": {k: len(v) for k, v in phases.items()},
        "phases_median_s": {k: round(statistics.median(v), 5) for k, v in phases.items()},
        "phases_max_s": {k: round(max(v), 5) for k, v in phases.items()},
        "switch_total_median_s": round(statistics.median(r.total_s for r in reports), 5),
        "switch_wall_median_s": round(statistics.median(r.wall_s for r in reports), 5),
        "leave_rollout_total_median_s": _median([r.total_s for r in reports if r.to_role != "rollout"]),
        "enter_rollout_total_median_s": _median([r.total_s for r in reports if r.to_role == "rollout"]),
    }


def _median(xs: list[float]) -> float | None:
    return round(statistics.median(xs), 5) if xs else None


def failures(sw: dict[str, Any]) -> list[str]:
    """Why the switch run failed (empty: it passed)."""
    out = []
    if sw["statuses"].get("error", 0) or sw["statuses_stored"].get("error", 0):
        out.append(f"executions in error: {sw['statuses']} (stored {sw['statuses_stored']}): {sw['errors']}")
    if sw["statuses_stored"].get("missing", 0) or sw["statuses_stored"].get("running", 0):
        out.append(f"executions missing or unfinished in the store: {sw['statuses_stored']}")
    if sw["calls_lost"] or sw["calls_duplicated"]:
        out.append(f"calls lost {sw['calls_lost']}, duplicated {sw['calls_duplicated']}")
    if sw["calls_rerouted"] < sw["aborted_calls"]:
        out.append(f"{sw['aborted_calls']} calls aborted but only {sw['calls_rerouted']} continued")
    if sw["aborting_switches"] == 0:
        out.append("no switch met a call in flight: nothing was measured")
    return out


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
    for col in ("phase", "samples", "median ms", "max ms"):
        table.add_column(col, justify="right")
    for k, v in sw["phases_median_s"].items():
        table.add_row(k, str(sw["phases_samples"][k]), f"{v * 1e3:.1f}", f"{sw['phases_max_s'][k] * 1e3:.1f}")
    table.add_row("whole switch (sum)", str(sw["switches"]), f"{sw['switch_total_median_s'] * 1e3:.1f}", "")
    table.add_row("whole switch (wall)", str(sw["switches"]), f"{sw['switch_wall_median_s'] * 1e3:.1f}", "")
    console.print(table)
    console.print(f"executions: {sw['statuses']} (stored {sw['statuses_stored']}); calls lost {sw['calls_lost']}, "
                  f"duplicated {sw['calls_duplicated']}, continued {sw['calls_rerouted']}")
    failed = failures(sw)
    if not args.skip_demo:
        demo = run_elastic_demo(ElasticDemoConfig(executions=args.executions, eval_executions=0,
                                                  critic_replay_executions=0, out_dir=out / "demo"))
        keep = ("wall_s", "steps", "switches", "calls_lost", "calls_duplicated", "envs_reset", "executions_error")
        result["demo"] = {name: {k: s[k] for k in keep} for name, s in demo["schedules"].items()}
        for key in ("wall_async_over_elastic", "wall_colocate_over_elastic"):
            result[key] = demo.get(key)
        console.print(f"wall time: static/elastic {result['wall_async_over_elastic']}, "
                      f"colocated/elastic {result['wall_colocate_over_elastic']}")
        failed += [f"demo {name}: {n} executions in error" for name, s in demo["schedules"].items()
                   if (n := s["executions_error"])]
    ray.shutdown()
    result["failures"] = failed
    print(json.dumps(result), flush=True)
    if failed:
        console.print("[red]FAILED:[/red] " + "; ".join(failed))
        sys.exit(1)


if __name__ == "__main__":
    main()
