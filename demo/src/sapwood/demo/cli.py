"""``sapwood demo``: asynchronous single-rollout RL on the key-recall task, recorded in Sapwood.

Only typer and rich are imported with this module (the ``sapwood`` CLI registers it on every start);
the demo itself (torch, matplotlib, the learner) is imported when the command runs, after checking
that the ``demo`` extra (and for ``--elastic`` the ``ray`` extra) is installed.
"""

from __future__ import annotations

import importlib
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, cast

import typer
from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

    from sapwood.demo.config import DemoResult

console = Console(stderr=True)

_PHASES = {"pretrain": "pre-training (v0)", "eval-start": "evaluating v0", "rollout": "rollouts + training",
           "eval-end": "evaluating final policy"}

# Rows of the result table: (summary key, label).
_ROWS = [
    ("reward_start", "mean reward at start (eval, policy v0)"),
    ("reward_end", "mean reward at end (eval, final policy)"),
    ("summary_recall_start", "summary keeps remaining key, start (eval)"),
    ("summary_recall_end", "summary keeps remaining key, end (eval)"),
    ("invalid_actions_start", "invalid actions per execution, start (eval)"),
    ("invalid_actions_end", "invalid actions per execution, end (eval)"),
    ("rollout_reward_first", "rollout reward, first window"),
    ("rollout_reward_last", "rollout reward, last window"),
    ("executions", "training executions"),
    ("trajectories", "trajectories (fork branches)"),
    ("generated_tokens", "generated tokens"),
    ("calls", "model calls"),
    ("compactions", "compactions"),
    ("forks", "forks"),
    ("eval_forks_start", "forks per execution, start (eval)"),
    ("eval_forks_end", "forks per execution, end (eval)"),
    ("eval_segments_mean", "segments per trajectory, mean (eval, start)"),
    ("timeouts", "timeouts (scored by partial score)"),
    ("timeout_partial_score_mean", "mean partial score of timeouts"),
    ("dedup_ratio", "tree dedup ratio (naive / tree tokens)"),
    ("learner_steps", "learner steps"),
    ("policy_version", "final policy version"),
    ("staleness_mean", "staleness of trained tokens, mean (versions)"),
    ("staleness_max", "staleness, max (versions)"),
    ("dis_masked_frac", "trained tokens dropped by the DIS window"),
    ("backlog_max", "max trainer backlog (executions)"),
    ("ingest_lag_max", "max Kafka ingest lag (records)"),
    ("pretrain_clean_steps", "pre-training steps on clean demonstrations"),
    ("seconds_pretrain", "pre-training seconds"),
    ("seconds_async", "async phase seconds"),
    ("seconds_total", "total seconds"),
]

#: Third-party packages ``sapwood demo`` needs beyond the base install, with the extra that brings each.
DEMO_PACKAGES = {"torch": "demo", "matplotlib": "demo"}
ELASTIC_PACKAGES = {**DEMO_PACKAGES, "ray": "ray"}
COMPARE_PACKAGES = {**ELASTIC_PACKAGES, "simpy": "scheduler"}


def require_extras(command: str, packages: dict[str, str]) -> None:
    """Exit with a clear message naming the extras to install when any of ``packages`` is missing."""
    missing = []
    for name in packages:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        extras = ",".join(dict.fromkeys(packages[name] for name in missing))
        console.print(f"[red]error:[/] `{command}` needs {', '.join(missing)}, which this installation lacks: "
                      f"install sapwood\\[{extras}] (pip install 'sapwood\\[{extras}]')")
        raise typer.Exit(1)


class _Display:
    """Rich progress bars fed by the demo's progress hook."""

    def __init__(self, progress: Progress | None) -> None:
        self.progress = progress
        self.tasks: dict[str, TaskID] = {}
        self.prefix = ""

    def __call__(self, phase: str, done: int, total: int, info: dict[str, Any]) -> None:
        if self.progress is None:
            return
        key = self.prefix + phase
        if key not in self.tasks:
            self.tasks[key] = self.progress.add_task(f"{self.prefix}{_PHASES.get(phase, phase)}", total=total,
                                                     info="")
        if phase == "pretrain":
            text = f"loss {info.get('loss', math.nan):.3f}"
        elif phase == "rollout":
            text = (f"v{int(info.get('policy_version', 0))}  reward(32) {info.get('reward_recent', math.nan):.3f}  "
                    f"trained {int(info.get('trained', 0))}  backlog {int(info.get('backlog', 0))}  "
                    f"staleness {info.get('staleness_mean', 0.0):.2f}")
            if info.get("ingest_lag"):
                text += f"  ingest lag {int(info['ingest_lag'])}"
        else:
            text = f"reward {info.get('reward', math.nan):.3f}"
        self.progress.update(self.tasks[key], completed=done, total=total, info=text)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:,.4g}" if abs(value) < 1e4 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in value.items())
    return str(value)


def _table(title: str, results: dict[str, list[DemoResult]]) -> Table:
    """One column per arm; figures averaged over the arm's seeds."""
    table = Table(title=title)
    table.add_column("figure")
    for name, runs in results.items():
        table.add_column(name if len(runs) == 1 else f"{name} (mean of {len(runs)} seeds)", justify="right")
    for key, label in _ROWS:
        cells = []
        for runs in results.values():
            values = [r.summary.get(key) for r in runs]
            nums = [float(v) for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
            if len(values) > 1 and len(nums) == len(values):
                cells.append(_fmt(sum(nums) / len(nums)))
            else:
                cells.append(_fmt(values[0]))
        table.add_row(label, *cells)
    return table


def _seed_table(title: str, results: dict[str, list[DemoResult]]) -> Table:
    """Per seed, side by side: each arm's final reward (and forks per execution at the end)."""
    table = Table(title=title)
    table.add_column("seed")
    for name in results:
        table.add_column(f"{name}: reward end / forks", justify="right")
    for i, first in enumerate(next(iter(results.values()))):
        cells = [f"{r[i].summary['reward_end']:.3f} / {r[i].summary['eval_forks_end']:.2f}" for r in results.values()]
        table.add_row(str(first.summary["seed"]), *cells)
    return table


def demo(
    seed: Annotated[int, typer.Option(help="seeds tasks, pre-training, weights and sampling")] = 0,
    workers: Annotated[int, typer.Option(help="rollout worker threads")] = 2,
    executions: Annotated[int, typer.Option(help="training rollouts to play")] = 640,
    max_seconds: Annotated[float, typer.Option(help="wall-clock cap of the rollout + training phase")] = 200.0,
    eval_executions: Annotated[int, typer.Option(help="evaluation executions at start and end")] = 128,
    database_url: Annotated[str | None, typer.Option("--database-url", help="store URL (default: SQLite in the "
                                                     "output directory)")] = None,
    kafka: Annotated[str | None, typer.Option("--kafka", metavar="BOOTSTRAP", help="record through Kafka at "
                                              "host:port and run the ingest service (needs --database-url)")] = None,
    out_dir: Annotated[Path | None, typer.Option(help="plots, checkpoints, summary (default: a temp dir)")] = None,
    loss: Annotated[str, typer.Option(help="loss aggregation: token | segment_mean")] = "token",
    frozen_summarizer: Annotated[bool, typer.Option(help="do not train summary tokens")] = False,
    ablation: Annotated[str | None, typer.Option(help="run arms side by side: loss | summarizer | "
                                                         "all | forks | segments")] = None,
    seeds: Annotated[int, typer.Option(help="ablations: run seeds SEED … SEED+N-1 per arm")] = 1,
    pretrain_steps: Annotated[int, typer.Option(help="most clean pre-training steps (it stops earlier once "
                                                "the copy mechanism has formed)")] = 700,
    pretrain_noisy_steps: Annotated[int, typer.Option(help="pre-training steps on imperfect demonstrations")] = 90,
    max_backlog: Annotated[int, typer.Option(help="workers pause at this many untrained executions")] = 16,
    threads: Annotated[int, typer.Option(help="torch CPU threads")] = 1,
    quiet: Annotated[bool, typer.Option(help="no progress bars or tables, only the JSON line")] = False,
    backend: Annotated[str, typer.Option(help="learner backend: torch | megatron (with --elastic: the train "
                                         "cells' replicas)")] = "torch",
    elastic: Annotated[bool, typer.Option(help="the elastic runtime on Ray instead: cells moved by the scheduler, "
                                          "against a static split and a colocated schedule")] = False,
    cells: Annotated[int, typer.Option(help="--elastic: cells (Ray actors)")] = 3,
    elastic_executions: Annotated[int, typer.Option(help="--elastic: executions per schedule")] = 48,
    ray_address: Annotated[str | None, typer.Option(help="--elastic: join this Ray cluster")] = None,
    staleness_bound: Annotated[int, typer.Option(help="--elastic: policy versions a trained execution may lag, "
                                                 "0 or 1 (admission: batch size × (1 + bound) ahead)")] = 1,
    compare: Annotated[bool, typer.Option(help="--elastic: elastic against every static split (the best one "
                                          "reported) and colocate on several seeds, with the simulator's "
                                          "prediction beside the live ratios")] = False,
    compare_seeds: Annotated[int, typer.Option(help="--elastic --compare: seeds SEED … SEED+N-1")] = 3,
    compare_reference: Annotated[bool, typer.Option(help="--elastic --compare: also the synchronous colocate "
                                                    "(one batch per policy version), a reference arm with no "
                                                    "goal")] = False,
) -> None:
    """Train a tiny agent with asynchronous single-rollout RL and record every call in Sapwood.

    Embedded by default (SQLite, in-process transport, no servers). The last line printed is
    a JSON object with the figures.
    """
    from dataclasses import replace

    if compare_reference and not (elastic and compare):
        raise typer.BadParameter("--compare-reference adds an arm to the elastic comparison: use it with --elastic "
                                 "--compare")
    if elastic:
        if compare:
            require_extras("sapwood demo --elastic --compare", COMPARE_PACKAGES)
        else:
            require_extras("sapwood demo --elastic", ELASTIC_PACKAGES)
        from sapwood.demo.elastic.cli import elastic_demo

        elastic_demo(seed=seed, cells=cells, executions=elastic_executions, out_dir=out_dir, quiet=quiet,
                     ray_address=ray_address, console=console, staleness_bound=staleness_bound,
                     compare_seeds=compare_seeds if compare else None, learner_backend=backend,
                     compare_reference=compare_reference)
        return
    if compare:
        raise typer.BadParameter("--compare compares the elastic runtime's schedules: use it with --elastic")
    require_extras("sapwood demo", DEMO_PACKAGES)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from sapwood.demo.ablations import ablation_verdicts, run_ablation
    from sapwood.demo.config import DemoConfig
    from sapwood.demo.driver import run_demo
    from sapwood.demo.pretrain import PretrainConfig
    from sapwood.platform.errors import ValidationError

    if loss not in ("token", "segment_mean"):
        raise typer.BadParameter("--loss must be 'token' or 'segment_mean'")
    cfg = DemoConfig(seed=seed, workers=workers, executions=executions, max_seconds=max_seconds,
                     eval_executions=eval_executions, database_url=database_url, kafka_bootstrap=kafka,
                     out_dir=out_dir, aggregation=cast(Literal["token", "segment_mean"], loss),
                     train_summaries=not frozen_summarizer, torch_threads=threads, max_backlog=max_backlog,
                     backend=backend,
                     pretrain=replace(PretrainConfig(), max_clean_steps=pretrain_steps,
                                      min_clean_steps=min(pretrain_steps, PretrainConfig().min_clean_steps),
                                      noisy_steps=pretrain_noisy_steps))
    try:
        cfg.validate()
    except ValidationError as exc:
        raise typer.BadParameter(str(exc)) from None
    progress = None if quiet else Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                           TimeElapsedColumn(), TextColumn("{task.fields[info]}"), console=console)
    display = _Display(progress)
    if progress is not None:
        progress.start()
    if seeds < 1:
        raise typer.BadParameter("--seeds must be ≥ 1")
    try:
        if ablation:
            def on_arm(name: str, arm_seed: int) -> None:
                display.prefix = f"[{name}, seed {arm_seed}] "

            results = run_ablation(cfg, ablation, seeds=list(range(seed, seed + seeds)), hook=display,
                                   on_arm=on_arm)
        else:
            results = {"demo": [run_demo(cfg, hook=display)]}
    except ValidationError as exc:
        raise typer.BadParameter(str(exc)) from None
    finally:
        if progress is not None:
            progress.stop()
    if ablation:
        verdicts = ablation_verdicts(results)
        if not quiet:
            console.print(_table(f"Ablation: {ablation} (seeds {seed}…{seed + seeds - 1})", results))
            console.print(_seed_table("Per seed", results))
            for v in verdicts:
                console.print(
                    f"{v['arm']}: {v['reference']} ends {v['delta_reward_end_mean']:+.4f} reward above it on average "
                    f"(reference better in {v['seeds_baseline_better']} of {len(v['seeds'])} seeds; gain difference "
                    f"{v['delta_gain_mean']:+.4f}). Sources: {v['source']}. Direction "
                    f"{'reproduced' if v['direction_reproduced'] else 'NOT reproduced'} here.")
        line: dict[str, Any] = {"ablation": ablation, "seeds": list(range(seed, seed + seeds)),
                                "comparisons": verdicts,
                                "arms": {k: [r.summary for r in v] for k, v in results.items()}}
    else:
        result = results["demo"][0]
        if not quiet:
            console.print(_table(f"Sapwood demo (seed {seed})", results))
            for p in result.summary.get("plots", []):
                console.print(f"plot: {p}")
        line = result.summary
    print(json.dumps(line), flush=True)


def register(app: typer.Typer) -> None:
    """Add the ``demo`` command to the ``sapwood`` CLI."""
    app.command("demo")(demo)
    from sapwood.demo.chaos import cli as chaos_cli

    chaos_cli.register(app)


__all__ = ["demo", "register"]
