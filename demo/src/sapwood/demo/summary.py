"""The figures of a demo run: the JSON summary line (:func:`summarize`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import numpy as np

from sapwood.demo.config import DemoConfig
from sapwood.demo.pretrain import PretrainResult
from sapwood.demo.worker import ExecutionReport
from sapwood.platform.storage.dialects import backend_of

__all__ = ["RunRecord", "redact", "summarize"]


class RunRecord(Protocol):
    """What :func:`summarize` reads of a run in progress (the driver's counters and series)."""

    cfg: DemoConfig
    database_url: str
    out_dir: Path
    reports: list[ExecutionReport]
    metrics: list[dict[str, float]]
    timeline: list[dict[str, float]]
    trained: int
    worker_errors: int


def summarize(run: RunRecord, stats: dict[str, Any], eval_start: list[ExecutionReport],
              eval_end: list[ExecutionReport], pre: PretrainResult, cached: bool, rl_s: float, eval_s: float,
              total_s: float, timed_out: bool, version: int) -> dict[str, Any]:
    """The JSON summary of a run: rewards at start and end, tree and store figures, lags and timings.

    ``stats`` is :meth:`Store.stats`; ``rl_s``, ``eval_s`` and ``total_s`` are seconds of the
    asynchronous phase, the start evaluation and the whole run.
    """
    cfg = run.cfg
    reps = run.reports
    window = max(1, min(100, len(reps) // 4))
    timeouts = [r for r in reps if r.status == "timeout"]
    tok = np.array([m.get("train/trainable_tokens", 0.0) for m in run.metrics])
    st_mean = np.array([m.get("policy/staleness_mean", 0.0) for m in run.metrics])
    st_max = [m.get("policy/staleness_max", 0.0) for m in run.metrics]
    masked = np.array([m.get("policy/masked_frac", 0.0) for m in run.metrics])
    versions_behind = float((tok * st_mean).sum() / tok.sum()) if tok.sum() > 0 else 0.0

    def mean(xs: list[float]) -> float:
        return round(float(np.mean(xs)), 4) if xs else float("nan")

    seg_start = [1.0 + r.compactions / max(1, len(r.leaf_scores)) for r in eval_start]

    return {
        "seed": cfg.seed,
        "store": backend_of(run.database_url),
        "transport": "kafka" if cfg.kafka_bootstrap else "in-process",
        "aggregation": cfg.aggregation,
        "backend": cfg.backend,
        "fork_weighting": cfg.fork_weighting,
        "train_summaries": cfg.train_summaries,
        "reward_start": mean([r.reward for r in eval_start]),
        "reward_end": mean([r.reward for r in eval_end]),
        "eval_executions": len(eval_start),
        "rollout_reward_first": mean([r.reward for r in reps[:window]]),
        "rollout_reward_last": mean([r.reward for r in reps[-window:]]),
        "rollout_window": window,
        "summary_recall_start": mean([x for r in eval_start for x in r.summary_recall]),
        "summary_recall_end": mean([x for r in eval_end for x in r.summary_recall]),
        "invalid_actions_start": mean([float(r.invalid_actions) for r in eval_start]),
        "invalid_actions_end": mean([float(r.invalid_actions) for r in eval_end]),
        "executions": len(reps),
        "trajectories": sum(len(r.leaf_scores) for r in reps),
        "generated_tokens": sum(r.generated_tokens for r in reps),
        "calls": sum(r.calls for r in reps),
        "compactions": sum(r.compactions for r in reps),
        "forks": sum(r.forks for r in reps),
        "eval_forks_start": mean([float(r.forks) for r in eval_start]),
        "eval_forks_end": mean([float(r.forks) for r in eval_end]),
        "rollout_forks_first": mean([float(r.forks) for r in reps[:window]]),
        "rollout_forks_last": mean([float(r.forks) for r in reps[-window:]]),
        # Segments per trajectory of the start evaluation (compactions spread over its trajectories).
        "eval_segments_mean": mean(seg_start),
        "eval_segments_max": max(seg_start, default=0.0),
        "timeouts": len(timeouts),
        "timeout_partial_score_mean": mean([r.partial_score for r in timeouts if r.partial_score is not None]),
        "worker_errors": run.worker_errors,
        "store_executions": stats["executions"],
        "store_tree_tokens": stats["tree_tokens"],
        "store_naive_tokens": stats["naive_tokens"],
        "dedup_ratio": stats["dedup_ratio"],
        "learner_steps": len(run.metrics),
        "trained_executions": run.trained,
        "policy_version": version,
        "staleness_mean": round(versions_behind, 3),
        "staleness_max": float(max(st_max)) if st_max else 0.0,
        "dis_masked_frac": round(float((tok * masked).sum() / tok.sum()), 4) if tok.sum() > 0 else 0.0,
        "backlog_max": max((row["backlog"] for row in run.timeline), default=0.0),
        "ingest_lag_max": max((row["ingest_lag"] for row in run.timeline), default=0.0),
        "time_capped": timed_out,
        "seconds_pretrain": round(pre.seconds, 1) if not cached else 0.0,
        "pretrain_loss": round(pre.losses[-1], 4) if pre.losses else float("nan"),
        "pretrain_clean_steps": pre.clean_steps,
        "pretrain_converged": pre.converged,
        "seconds_eval_start": round(eval_s, 1),
        "seconds_async": round(rl_s, 1),
        "seconds_total": round(total_s, 1),
        "out_dir": str(run.out_dir),
        "database_url": redact(run.database_url),
    }


def redact(url: str) -> str:
    """``url`` with its password hidden (for summaries and logs)."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return "<unparseable url>"
