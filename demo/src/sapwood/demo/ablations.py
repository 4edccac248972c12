"""Demo ablations: arms run side by side on the same seeds (same tasks, same start policy per seed).

* ``loss`` / ``summarizer`` / ``all``: the default task, token-level loss and trained summarizer
  against the per-segment mean loss and a frozen summarizer.
* ``forks``: a task variant where forking is frequent and the policy's choice (a ``FORK``
  action, taught at 15 % of turns by the demonstrator, two forks per trajectory at most, each
  costing a turn and earning nothing) with path-probability token weights against unit weights.
  Does the unit-weight arm learn to fork more, or learn worse?
* ``segments``: a task variant whose executions differ strongly in segment count (keys of 3–14
  symbols, 3 turns per segment: 1 to 5 segments), token-level loss against the per-segment mean
  (which counts a 5-segment execution 5 times).

The first arm of each ablation is its reference; every other arm is compared with it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from sapwood.demo.config import DemoConfig, DemoResult, ProgressHook
from sapwood.demo.driver import run_demo
from sapwood.demo.tasks import KeyRecallConfig
from sapwood.platform.errors import ValidationError

__all__ = ["ABLATIONS", "ARMS", "SOURCE_FIGURES", "ablation_verdicts", "fork_task", "run_ablation", "segment_task"]


def fork_task(cfg: DemoConfig) -> DemoConfig:
    """The forking variant: no random forks; the policy may fork twice per trajectory with ``FORK``."""
    return replace(cfg, task=replace(cfg.task, fork_prob=0.0, policy_forks=2),
                   pretrain=replace(cfg.pretrain, noise=replace(cfg.pretrain.noise, fork_action=0.15)))


SEGMENT_TASK = KeyRecallConfig(min_key=3, max_key=14, context_limit=49, max_turns=16)
"""Keys of 3–14 symbols with room for 3 turns per segment: 1 (short keys) to 5 segments (long ones)."""


def segment_task(cfg: DemoConfig) -> DemoConfig:
    """The variant whose executions differ strongly in segment count (``SEGMENT_TASK``)."""
    return replace(cfg, task=replace(SEGMENT_TASK, fork_prob=cfg.task.fork_prob))


def _with(**changes: Any) -> Callable[[DemoConfig], DemoConfig]:
    return lambda cfg: replace(cfg, **changes)


def _then(first: Callable[[DemoConfig], DemoConfig], **changes: Any) -> Callable[[DemoConfig], DemoConfig]:
    return lambda cfg: replace(first(cfg), **changes)


#: Ablation arms: name → how the arm changes the base configuration.
ARMS: dict[str, Callable[[DemoConfig], DemoConfig]] = {
    "baseline": _with(),
    "segment-mean loss": _with(aggregation="segment_mean"),
    "frozen summarizer": _with(train_summaries=False),
    "fork task, path weights": _then(fork_task, fork_weighting="path"),
    "fork task, unit weights": _then(fork_task, fork_weighting="unit"),
    "segment task, token-level loss": _then(segment_task, aggregation="token"),
    "segment task, segment-mean loss": _then(segment_task, aggregation="segment_mean"),
}
#: Ablation → its arms; the first is the reference the others are compared with.
ABLATIONS: dict[str, list[str]] = {
    "loss": ["baseline", "segment-mean loss"],
    "summarizer": ["baseline", "frozen summarizer"],
    "all": ["baseline", "segment-mean loss", "frozen summarizer"],
    "forks": ["fork task, path weights", "fork task, unit weights"],
    "segments": ["segment task, token-level loss", "segment task, segment-mean loss"],
}
#: What the sources measured for each ablated arm (the reference better in every case).
SOURCE_FIGURES: dict[str, str] = {
    "segment-mean loss": "CompactionRL: 66.8 with token-level loss vs 60.0 without",
    "segment task, segment-mean loss": "CompactionRL: 66.8 with token-level loss vs 60.0 without",
    "frozen summarizer": "CompactionRL: 55.5 with the trained summarizer vs 49.0 with a worse one",
    "fork task, unit weights": "QwenGyre: an execution's weight must be decoupled from its number of forks "
                               "(no figure given)",
}


def run_ablation(cfg: DemoConfig, kind: str, *, seeds: list[int] | None = None, hook: ProgressHook | None = None,
                 on_arm: Callable[[str, int], None] | None = None) -> dict[str, list[DemoResult]]:
    """Run every arm of ablation ``kind`` for each seed (same seed ⇒ same tasks and start policy).

    Returns arm name → one result per seed, the reference arm first.
    """
    if kind not in ABLATIONS:
        raise ValidationError(f"unknown ablation {kind!r}; expected one of {sorted(ABLATIONS)}")
    out: dict[str, list[DemoResult]] = {name: [] for name in ABLATIONS[kind]}
    base = cfg.out_dir
    for seed in seeds or [cfg.seed]:
        for name in ABLATIONS[kind]:
            if on_arm is not None:
                on_arm(name, seed)
            arm_dir = (Path(base) / f"seed{seed}-{name.replace(' ', '-').replace(',', '')}") if base else None
            out[name].append(run_demo(replace(ARMS[name](cfg), seed=seed, out_dir=arm_dir), hook=hook))
    return out


def _deltas(base: list[DemoResult], arm: list[DemoResult], figure: Callable[[dict[str, Any]], float]) -> list[float]:
    return [figure(b.summary) - figure(a.summary) for b, a in zip(base, arm, strict=True)]


def ablation_verdicts(results: dict[str, list[DemoResult]]) -> list[dict[str, Any]]:
    """Compare each arm with the reference (the first): final reward, gain and forks, per seed and on average.

    ``direction_reproduced`` is True when the reference ends higher on average (the sources' direction).
    """
    names = list(results)
    reference, base = names[0], results[names[0]]
    verdicts = []
    for name in names[1:]:
        arm = results[name]
        d_end = _deltas(base, arm, lambda s: s["reward_end"])
        d_gain = _deltas(base, arm, lambda s: s["reward_end"] - s["reward_start"])
        d_roll = _deltas(base, arm, lambda s: s["rollout_reward_last"])
        verdicts.append({
            "arm": name,
            "reference": reference,
            "source": SOURCE_FIGURES.get(name, ""),
            "seeds": [b.summary["seed"] for b in base],
            "baseline_reward_end": [b.summary["reward_end"] for b in base],
            "arm_reward_end": [a.summary["reward_end"] for a in arm],
            "baseline_eval_forks_end": [b.summary["eval_forks_end"] for b in base],
            "arm_eval_forks_end": [a.summary["eval_forks_end"] for a in arm],
            "delta_reward_end": [round(x, 4) for x in d_end],
            "delta_reward_end_mean": round(float(np.mean(d_end)), 4),
            "delta_gain_mean": round(float(np.mean(d_gain)), 4),
            "delta_rollout_last_mean": round(float(np.mean(d_roll)), 4),
            "seeds_baseline_better": int(sum(x > 0 for x in d_end)),
            "direction_reproduced": bool(np.mean(d_end) > 0),
        })
    return verdicts
