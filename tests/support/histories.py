"""Shared builders of event histories for the platform tests."""

from __future__ import annotations

import numpy as np

from sapwood.platform.events import ModelCall
from sapwood.platform.synthetic import SynthConfig, synthetic_execution
from sapwood.platform.writer import ExecutionWriter

SMALL = SynthConfig(calls=12, forks=2, fork_depth=2, segments=3, obs_min=5, obs_max=40, out_min=3, out_max=20,
                    system_tokens=30, task_tokens=10, template_tokens=2, summary_tokens=8, vocab_size=500)


def small_execution(seed: int = 0, **overrides: object) -> ExecutionWriter:
    """A small execution with forks, observations and compaction segments."""
    cfg = SynthConfig(**{**SMALL.__dict__, "seed": seed, **overrides})
    return synthetic_execution(cfg)


def tokens(rng: np.random.Generator, n: int, vocab: int = 500) -> np.ndarray:
    return rng.integers(0, vocab, n, dtype=np.int32)


def expected_input(writer: ExecutionWriter, call: ModelCall) -> np.ndarray:
    """The exact input a writer sent for ``call`` (context of its parent + appended tokens)."""
    if call.parent is None:
        return np.asarray(call.appended)
    return np.concatenate([writer.context(call.parent), call.appended])


def drift_execution(run_id: str, checks: list[tuple[bool, int | None]]) -> ExecutionWriter:
    """One finished execution of ``run_id`` with one call per ``(drift_checked, drift_at)``, each continuing
    the last: call k's input holds 4 + 2k ids (3 prompt ids, then one appended id and one output id per call)."""
    w = ExecutionWriter(run_id=run_id, task_id=f"{run_id}-task")
    w.start()
    parent = w.prompt(np.array([1, 2, 3], dtype=np.int32)).node_id
    for checked, at in checks:
        parent = w.call(parent, np.array([4], dtype=np.int32), [5], np.array([-0.5], dtype=np.float32),
                        drift_checked=checked, drift_at=at).output_node_id
    w.finish()
    return w
