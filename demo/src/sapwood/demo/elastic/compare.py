"""``sapwood demo --elastic --compare``: elastic against the best static split and colocate, live and simulated.

Per seed, one live run plays every schedule on the same tasks, length scales and pre-trained policy:
``elastic``, every static split ``static-1`` … ``static-{cells − 1}`` (the best, i.e. fastest, of them is the
baseline: a tuned static split, not a convenient one), ``colocate`` (admitting one batch ahead, as every other
arm: the baseline of the colocate goal) and, with ``--compare-reference``, ``colocate-sync`` (the synchronous
colocate that admits one batch per policy version: verl's colocated on-policy mode; no goal is set against it;
opt-in, as it adds a sixth of the run's time). The ratios
are wall-time ratios (other / elastic; above 1: elastic is faster), taken per seed and summarised by their
geometric mean.

The simulator's prediction beside them: the same workload (cells, batch, steps, admission bound,
first-finished batches, no timeout) through :mod:`sapwood.scheduler.simulator`, its costs calibrated from
that seed's live run (:func:`calibrated_workload`):

* rollout ``i``'s duration is replayed (``Workload.durations_s``): the median over the arms of execution
  ``i``'s measured wall time less the time its calls waited for a slot (the router's
  ``session_times``), i.e. what it takes on an idle cluster; the simulator adds its own queueing.
* slots: a live execution holds a slot only while a call decodes (its agent loop, environment and
  recorder between calls free it), a simulated rollout for its whole duration. The simulator gets
  ``capacity ÷ duty`` slots per cell (rounded; duty ≤ 1, so never fewer than ``capacity``), ``duty`` =
  slot-seconds held ÷ uncontended execution-seconds, measured: a fluid approximation, the modelling
  choice said here.
* a training step: ``serial + cell-seconds ÷ train cells`` (:func:`step_cost_fit`), fitted to the static
  arms' measured step walls (the median wall per train-cell count, a least-squares line in 1 ÷ cells): the
  core's update, the commit and the weight broadcast do not shrink with more train cells, the
  micro-batches do. Switch and join costs from the elastic arm's measured switch walls.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from sapwood.demo.elastic.driver import (
    SYNC_COLOCATE,
    ElasticDemoConfig,
    ScheduleResult,
    run_elastic_demo,
    schedule_policy,
    static_splits,
)

__all__ = [
    "GOALS",
    "calibrated_workload",
    "compare_schedules",
    "predict",
    "run_compare",
    "step_cost_fit",
    "summarise_seed",
    "uncontended_durations",
]

GOALS = {"elastic_over_best_static": 1.2, "elastic_over_colocate": 1.3, "simulator_error": 0.15}
"""Issue 26's goals: elastic ≥ 1.2× the best static split and ≥ 1.3× colocate (geometric means over the
seeds), the simulator's ratios within ±15 % of the live ones, reward rising in every arm."""

REFERENCE = "elastic_over_colocate_sync"
"""The reference ratio (synchronous colocate ÷ elastic wall), reported live and simulated; no goal."""

INTEGRITY = ("calls_lost", "calls_duplicated", "envs_reset", "executions_missing", "executions_unfinished",
             "executions_error")
"""The store checks of every arm (:func:`~sapwood.demo.elastic.driver.store_check`): all 0 in a sound run."""

SIM_SEEDS = 5
"""Simulator runs per calibrated workload (their median wall time is the prediction)."""


def compare_schedules(cells: int, reference: bool = False) -> tuple[str, ...]:
    """``elastic``, every static split, ``colocate`` and, with ``reference``, ``colocate-sync``: what one seed
    of the comparison plays."""
    return ("elastic", *static_splits(cells), "colocate", *((SYNC_COLOCATE,) if reference else ()))


def summarise_seed(seed: int, schedules: dict[str, dict[str, Any]], eval_start: float | None) -> dict[str, Any]:
    """One seed's comparison from its schedules' summaries (``wall_s``, ``eval_reward_end``, …): the best static
    split, the ratios (other / elastic wall) and whether each arm's evaluation reward rose."""
    statics = {n: s for n, s in schedules.items() if n.startswith("static-")}
    if "elastic" not in schedules or "colocate" not in schedules or not statics:
        raise ValueError(f"seed {seed}: a comparison needs elastic, colocate and a static split, "
                         f"got {sorted(schedules)}")
    best = min(statics, key=lambda n: (statics[n]["wall_s"], n))
    elastic = schedules["elastic"]["wall_s"]
    rising = {n: (eval_start is not None and s.get("eval_reward_end") is not None
                  and s["eval_reward_end"] > eval_start) for n, s in schedules.items()}
    row = {"seed": seed, "best_static": best, "wall_s": {n: s["wall_s"] for n, s in schedules.items()},
           "elastic_over_best_static": round(statics[best]["wall_s"] / elastic, 4),
           "elastic_over_colocate": round(schedules["colocate"]["wall_s"] / elastic, 4),
           "eval_reward_start": eval_start,
           "eval_reward_end": {n: s.get("eval_reward_end") for n, s in schedules.items()},
           "reward_rising": rising}
    if SYNC_COLOCATE in schedules:
        row[REFERENCE] = round(schedules[SYNC_COLOCATE]["wall_s"] / elastic, 4)
    return row


def calibrated_workload(cfg: ElasticDemoConfig, results: dict[str, ScheduleResult]) -> Any:
    """The simulator's :class:`~sapwood.scheduler.simulator.Workload` for ``cfg`` with the costs measured in
    ``results`` (one seed's live schedules): see the module docstring. Raises ``ValueError`` when a cost
    cannot be measured (no finished execution, no slot time, no static training step)."""
    from sapwood.scheduler.simulator import Workload

    durations, duty = uncontended_durations(cfg.executions, results)
    cell_s, serial_s = step_cost_fit([step for name, r in results.items() if name.startswith("static-")
                                      for step in r.step_walls])
    switches = results["elastic"].switches if "elastic" in results else []
    into = {role: [sw["wall_s"] for sw in switches if sw["to"] == role] for role in ("rollout", "train")}
    return Workload(
        cells=cfg.cells, slots_per_cell=round(cfg.capacity / duty), batch_size=cfg.batch_size,
        steps=max(cfg.executions // cfg.batch_size, 1), rollout_p50_s=float(np.median(durations)),
        durations_s=tuple(durations), train_cell_s_per_step=cell_s, train_step_serial_s=serial_s,
        switch_cost_s=float(np.mean(into["rollout"])) if into["rollout"] else 0.0,
        join_cost_s=float(np.mean(into["train"])) if into["train"] else None,
        tick_s=cfg.tick_s, max_staleness=cfg.staleness_bound, core_cells=0, batch_rule="first_finished",
        stale_rollouts="discount", stale_weight=1.0, timeout_factor=math.inf)


def step_cost_fit(steps: Sequence[tuple[float, int]]) -> tuple[float, float]:
    """``(cell_s, serial_s)`` with ``wall ≈ serial_s + cell_s / n`` for measured steps ``(wall seconds, n train
    cells)``: a least-squares line through the median wall of each ``n`` against ``1 / n``. One ``n`` only (or
    a fit that is not ≥ 0 in both) keeps the linear model: ``serial_s = 0``, ``cell_s`` = median of wall × n."""
    if not steps:
        raise ValueError("no training step of a static split to calibrate a step's cell-seconds from")
    by_cells: dict[int, list[float]] = {}
    for wall, n in steps:
        by_cells.setdefault(n, []).append(wall)
    linear = float(np.median([wall * n for wall, n in steps]))
    if len(by_cells) < 2:
        return linear, 0.0
    x = np.array([1.0 / n for n in by_cells])
    y = np.array([float(np.median(v)) for v in by_cells.values()])
    cell_s, serial_s = (float(c) for c in np.polyfit(x, y, 1))
    if cell_s <= 1e-9 * float(y.max()) or serial_s < 0:  # no shrinking part (to float rounding), or superlinear
        return linear, 0.0
    return cell_s, serial_s


def uncontended_durations(executions: int, results: dict[str, ScheduleResult]) -> tuple[list[float], float]:
    """``(durations, duty)``: per task index ``0 … executions − 1`` (admission order), the median over the
    arms of its execution's wall seconds less its calls' wait for a slot; and slot-seconds held ÷ those
    seconds over every finished execution. A task no arm finished takes the median of the others."""
    per_task: dict[int, list[float]] = {}
    held = service = 0.0
    for r in results.values():
        for o in r.outcomes:
            times = r.slot_times.get(o.execution_id)
            if o.finished_at <= 0 or times is None or not o.task_id.startswith("task-"):
                continue
            alone = max(o.finished_at - o.started_at - times["waited_s"], times["held_s"], 1e-6)
            per_task.setdefault(int(o.task_id.removeprefix("task-")), []).append(alone)
            held += times["held_s"]
            service += alone
    if not per_task or held <= 0:
        raise ValueError("no finished execution with slot time to calibrate rollout durations and slots from")
    medians = {i: float(np.median(v)) for i, v in per_task.items()}
    fill = float(np.median(list(medians.values())))
    return [medians.get(i, fill) for i in range(executions)], held / service  # ≤ 1: alone ≥ held each


def predict(workload: Any, cells: int, staleness_bound: int, seeds: int = SIM_SEEDS, *,
            reference: bool = False) -> dict[str, Any]:
    """Simulated wall seconds and switch counts (medians over ``seeds`` runs) of every schedule of the
    comparison (the reference arm with ``reference``) and the ratios, the best static split chosen in the
    simulator as it is live."""
    from sapwood.scheduler.simulator import simulate

    walls: dict[str, float] = {}
    switches: dict[str, float] = {}
    for name in compare_schedules(cells, reference):
        policy, args = schedule_policy(name, cells, staleness_bound)  # the live arms' policy arguments
        runs = [simulate(workload, policy, seed=s, **args) for s in range(seeds)]
        walls[name] = float(np.median([r.wall_s for r in runs]))
        switches[name] = float(np.median([r.switch_count for r in runs]))
    statics = {n: w for n, w in walls.items() if n.startswith("static-")}
    best = min(statics, key=lambda n: (statics[n], n))
    out = {"wall_s": {n: round(w, 3) for n, w in walls.items()}, "switches": switches, "best_static": best,
           "elastic_over_best_static": round(statics[best] / walls["elastic"], 4),
           "elastic_over_colocate": round(walls["colocate"] / walls["elastic"], 4)}
    if reference:
        out[REFERENCE] = round(walls[SYNC_COLOCATE] / walls["elastic"], 4)
    return out


def _geomean(values: Sequence[float]) -> float:
    return round(float(np.exp(np.mean(np.log(values)))), 4)


def run_compare(cfg: ElasticDemoConfig, seeds: Sequence[int], *,
                on_tick: Callable[[str, int, int], None] | None = None,
                ray_address: str | None = None, reference: bool = False) -> dict[str, Any]:
    """Every seed live (all schedules; the synchronous colocate too with ``reference``) and through the
    simulator; returns the comparison's JSON summary (per seed, the geometric means, the goals and whether
    each is met) and writes ``compare.png``."""
    if not seeds:
        raise ValueError("--compare needs at least one seed")
    t0 = time.perf_counter()
    out_dir = Path(cfg.out_dir) if cfg.out_dir else None
    per_seed = []
    for seed in seeds:
        seed_dir = out_dir / f"seed-{seed}" if out_dir else None
        scfg = replace(cfg, seed=seed, schedules=compare_schedules(cfg.cells, reference),
                       out_dir=seed_dir)
        results: dict[str, ScheduleResult] = {}
        live = run_elastic_demo(scfg, on_tick=on_tick, ray_address=ray_address, keep=results)
        row = summarise_seed(seed, live["schedules"], live["eval_reward_start"])
        row["occupancy"] = {n: {k: s.get(k) for k in ("slot_occupancy", "train_cell_occupancy", "switches",
                                                      "switch_overhead_cell_s")}
                            for n, s in live["schedules"].items()}
        row["integrity"] = {n: {k: s[k] for k in INTEGRITY} for n, s in live["schedules"].items()}
        row["admitted_ahead_max"] = {n: s["admitted_ahead_max"] for n, s in live["schedules"].items()}
        row["critic_warmup"] = live["critic_warmup"]
        workload = calibrated_workload(scfg, results)
        row["calibration"] = {k: v for k, v in workload.to_json().items()
                              if k in ("rollout_p50_s", "slots_per_cell", "train_cell_s_per_step",
                                       "train_step_serial_s", "switch_cost_s", "join_cost_s")}
        row["simulator"] = predict(workload, cfg.cells, cfg.staleness_bound, reference=reference)
        row["out_dir"] = live["out_dir"]
        per_seed.append(row)
    summary = summarise(per_seed)
    summary["config"] = {k: v for k, v in vars(replace(cfg, out_dir=None)).items() if k != "pretrain"}
    summary["total_s"] = round(time.perf_counter() - t0, 1)
    if out_dir is not None:
        from sapwood.demo.elastic.plots import plot_compare

        summary["plots"] = [str(plot_compare(summary, out_dir))]
    return summary


def summarise(per_seed: list[dict[str, Any]]) -> dict[str, Any]:
    """Geometric means over the seeds, live and simulated, the simulator's relative error and the goals (the
    reference ratio, where every seed has it, is reported beside them and judged by no goal)."""
    out: dict[str, Any] = {"seeds": per_seed}

    def live_and_simulated(key: str) -> float:
        """Both geometric means of ratio ``key`` into ``out``; returns the simulator's relative error."""
        out[key] = live = _geomean([r[key] for r in per_seed])
        out[f"simulator_{key}"] = sim = _geomean([r["simulator"][key] for r in per_seed])
        return round(sim / live - 1.0, 4)

    errors = {key: live_and_simulated(key) for key in ("elastic_over_best_static", "elastic_over_colocate")}
    out["simulator_error"] = errors
    if all(REFERENCE in r and REFERENCE in r["simulator"] for r in per_seed):
        out["reference_simulator_error"] = live_and_simulated(REFERENCE)
    rising = all(all(r["reward_rising"].values()) for r in per_seed)
    out["goals"] = {
        "elastic_over_best_static": out["elastic_over_best_static"] >= GOALS["elastic_over_best_static"],
        "elastic_over_colocate": out["elastic_over_colocate"] >= GOALS["elastic_over_colocate"],
        "reward_rising_every_arm": rising,
        "simulator_within_15pct": all(abs(e) <= GOALS["simulator_error"] for e in errors.values()),
        "at_least_3_seeds": len(per_seed) >= 3,
    }
    return out
