"""The elastic demo's long-tail workload: every batch has its own heavy (Pareto) tail of rollout lengths.

Each execution gets a length scale ``s ≥ 1`` (× its per-token decode time on the cell, so × its
rollout's length in decode time) drawn from a Pareto with shape ``alpha`` (density ∝ s^-(alpha+1);
smaller: heavier tail), clipped at ``cap``. The draws are stratified per batch: the ``batch_size``
executions of one batch take one draw from each of ``batch_size`` equal-probability strata of the
distribution, in a shuffled order, so every batch (not only the run as a whole) holds its tail: a
few long executions that, near the batch's end, pin cells while the rest of the batch is done and
could train. With staleness bound 0 or 1 the next batch cannot be started far ahead to hide them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["LongTailWorkload"]


@dataclass(frozen=True)
class LongTailWorkload:
    """Per-batch stratified Pareto(``alpha``) length scales in ``[1, cap]``; ``staleness_bound`` 0 or 1."""

    batch_size: int = 8
    alpha: float = 1.3
    cap: float = 12.0
    staleness_bound: int = 1

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be ≥ 1, got {self.batch_size}")
        if not (np.isfinite(self.alpha) and self.alpha > 0):
            raise ValueError(f"alpha must be a finite number > 0, got {self.alpha}")
        if not (np.isfinite(self.cap) and self.cap >= 1):
            raise ValueError(f"cap must be a finite number ≥ 1, got {self.cap}")
        if self.staleness_bound not in (0, 1):
            raise ValueError(f"the long-tail workload runs at staleness bound 0 or 1, got {self.staleness_bound}")

    def quantile(self, u: np.ndarray) -> np.ndarray:
        """The clipped Pareto's inverse CDF at probabilities ``u`` in [0, 1): ``(1 - u)^(-1/alpha)``."""
        return np.minimum((1.0 - u) ** (-1.0 / self.alpha), self.cap)

    def scales(self, n: int, seed: int) -> list[float]:
        """Length scales of ``n`` executions in admission order (batch ``i`` is ``[i·B, (i+1)·B)``)."""
        if n < 0:
            raise ValueError(f"n must be ≥ 0, got {n}")
        rng = np.random.default_rng([seed, 4099])
        b = self.batch_size
        out: list[float] = []
        for start in range(0, n, b):
            strata = (np.arange(b) + rng.random(b)) / b  # one probability in each of B equal strata
            out += [float(x) for x in self.quantile(rng.permutation(strata))[: n - start]]
        return out

    def tail_share(self, scales: list[float]) -> float:
        """Fraction of the total length in the longest ``1/B`` of each batch's executions (≥ 1 per batch)."""
        b = self.batch_size
        total = sum(scales)
        top = sum(max(scales[i:i + b]) for i in range(0, len(scales), b))
        return top / total if total else 0.0
