"""Is the rollout length of re-issued prompt samples distributed like the others'? A two-sample test.

A resume that silently drops long rollouts (the failure other frameworks report) shows as re-issued samples
being *shorter* than the rest. The statistic is the two-sample Kolmogorov–Smirnov distance; its p-value
comes from a permutation test (no SciPy): the share of random relabellings of the pooled lengths whose
distance is at least the observed one.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence
from typing import Any

from sqlalchemy.engine import Connection

from sapwood.platform.storage.learner_reads import rollout_lengths


def ks_distance(a: Sequence[float], b: Sequence[float]) -> float:
    """max |F_a(x) − F_b(x)| over x, for the empirical CDFs of two non-empty samples."""
    if not a or not b:
        raise ValueError(f"both samples must be non-empty, got {len(a)} and {len(b)} values")
    xs, ys = sorted(a), sorted(b)
    i = j = 0
    best = 0.0
    while i < len(xs) and j < len(ys):
        x = min(xs[i], ys[j])
        while i < len(xs) and xs[i] <= x:
            i += 1
        while j < len(ys) and ys[j] <= x:
            j += 1
        best = max(best, abs(i / len(xs) - j / len(ys)))
    return best


def permutation_ks(a: Sequence[float], b: Sequence[float], *, rounds: int = 2000, seed: int = 0) -> tuple[float, float]:
    """(KS distance, permutation p-value in (0, 1]) of ``a`` vs ``b``; ``rounds`` random relabellings."""
    if rounds < 1:
        raise ValueError(f"rounds must be ≥ 1, got {rounds}")
    observed = ks_distance(a, b)
    pooled = list(a) + list(b)
    rng = random.Random(seed)
    at_least = 0
    for _ in range(rounds):
        rng.shuffle(pooled)
        if ks_distance(pooled[: len(a)], pooled[len(a) :]) >= observed - 1e-12:
            at_least += 1
    return observed, (at_least + 1) / (rounds + 1)


def length_bias(conn: Connection, attempts: Sequence[dict[str, Any]], *, seed: int = 0) -> dict[str, Any]:
    """Lengths of the finished executions of re-issued samples (≥ 1 abandoned attempt) vs the others.

    ``attempts``: rows of ``PromptQueue.attempts`` (``execution_id sample_id state``). Returns the counts,
    mean lengths, the KS distance and its permutation p-value (None when either group is empty).
    """
    reissued = {a["sample_id"] for a in attempts if a["state"] == "abandoned"}
    finished = [a for a in attempts if a["state"] == "finished"]
    lengths = rollout_lengths(conn, [a["execution_id"] for a in finished])
    re = [float(lengths[a["execution_id"]]) for a in finished if a["sample_id"] in reissued]
    rest = [float(lengths[a["execution_id"]]) for a in finished if a["sample_id"] not in reissued]
    out: dict[str, Any] = {
        "reissued": len(re),
        "others": len(rest),
        "mean_reissued": round(statistics.fmean(re), 3) if re else None,
        "mean_others": round(statistics.fmean(rest), 3) if rest else None,
        "ks": None,
        "p_value": None,
    }
    if re and rest:
        ks, p = permutation_ks(re, rest, seed=seed)
        out.update(ks=round(ks, 4), p_value=round(p, 4))
    return out
