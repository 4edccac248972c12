"""Synthetic long-horizon executions: many tool turns, forks, compaction, partial scores.

Used by ``sapwood synth``, the benchmarks and the tests; every event it yields is valid.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sapwood.platform.writer import ExecutionWriter


@dataclass
class SynthConfig:
    """Shape of one synthetic execution (defaults ≈ the 700K-token benchmark case)."""

    calls: int = 300
    """Model calls on the main path (fork branches add a few more)."""
    forks: int = 4
    """Fork points; each adds one side branch of ``fork_depth`` calls."""
    fork_depth: int = 3
    segments: int = 3
    """Compaction segments (segments − 1 summary calls + boundaries)."""
    obs_min: int = 1000
    obs_max: int = 3000
    """Observation length range (tokens)."""
    out_min: int = 100
    out_max: int = 450
    system_tokens: int = 1500
    task_tokens: int = 400
    template_tokens: int = 6
    summary_tokens: int = 600
    vocab_size: int = 32_000
    status: str = "success"
    seed: int = 0


def synthetic_execution(cfg: SynthConfig | None = None, *, run_id: str = "synthetic",
                        task_id: str | None = None, execution_id: str | None = None) -> ExecutionWriter:
    """Build one execution's events (``writer.events``) deterministically from ``cfg.seed``."""
    cfg = cfg or SynthConfig()
    rng = np.random.default_rng(cfg.seed)
    shared = np.random.default_rng(12345)  # the system prompt is the same for every execution
    system = shared.integers(0, cfg.vocab_size, cfg.system_tokens, dtype=np.int32)
    w = ExecutionWriter(run_id=run_id, task_id=task_id or f"task-{cfg.seed}", task_family="swe",
                        engine="synthetic", sampling_params={"temperature": 1.0, "top_p": 1.0},
                        vocab_size=cfg.vocab_size, execution_id=execution_id)
    w.start()

    def toks(n: int) -> np.ndarray:
        return rng.integers(0, cfg.vocab_size, n, dtype=np.int32)

    def lps(n: int) -> np.ndarray:
        return -rng.exponential(1.0, n).astype(np.float32)

    def turn(parent: str, kind: str = "action", version: int = 0) -> tuple[str, str]:
        n_out = int(rng.integers(cfg.out_min, cfg.out_max + (cfg.summary_tokens if kind == "summary" else 0)))
        call = w.call(parent, toks(cfg.template_tokens), toks(n_out), lps(n_out), kind=kind,
                      policy_version=version, timings={"latency_s": float(rng.uniform(0.5, 5))})
        return call.event_id, call.output_node_id

    task = toks(cfg.task_tokens)
    head = w.prompt(system, source="system").node_id
    head = w.prompt(task, parent=head, source="task").node_id
    per_segment = max(1, cfg.calls // max(1, cfg.segments))
    summaries = {per_segment * (s + 1) for s in range(cfg.segments - 1)}
    fork_at: set[int] = set()
    for k in range(cfg.forks):  # spread fork points over the calls, never on a summary call
        at = max(1, int(cfg.calls * (k + 0.5) / cfg.forks))
        while at in summaries or at in fork_at:
            at += 1
        fork_at.add(at)
    done = 0
    for segment in range(cfg.segments):
        last_segment = segment == cfg.segments - 1
        n_calls = cfg.calls - done if last_segment else per_segment
        for i in range(n_calls):
            is_summary = not last_segment and i == n_calls - 1
            _, out = turn(head, "summary" if is_summary else "action", version=done // 50)
            done += 1
            if is_summary:
                summary = w.context(out)[-cfg.summary_tokens :]
                head = w.compact(out, np.concatenate([task, summary])).root_node_id
                break
            obs = w.observe(out, toks(int(rng.integers(cfg.obs_min, cfg.obs_max + 1)))).node_id
            if done in fork_at:
                w.fork(obs, 2, reason="resample")
                side = obs
                for _ in range(cfg.fork_depth):
                    _, side_out = turn(side, version=done // 50)
                    side = w.observe(side_out, toks(int(rng.integers(cfg.obs_min, cfg.obs_max + 1)))).node_id
            head = obs
    if cfg.status == "timeout":
        w.score(float(rng.uniform(0.2, 0.8)), components={"tests_passed": 0.5}, scorer="synthetic")
        w.finish("timeout", reward=None, message="turn budget exhausted")
    else:
        w.finish(cfg.status, reward=float(rng.uniform(0, 1)))
    return w
