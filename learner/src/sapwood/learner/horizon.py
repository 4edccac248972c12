"""Horizon-aware GAE lambda: how much credit early compaction segments keep.

γ and λ count trainable tokens. Cross-trajectory GAE scales segment s's advantages by
``(γλ)^{N>s}``, N>s being the trainable tokens of the later segments, so with λ = 0.999
and ~5K trainable tokens per segment the first of three segments keeps
``0.999^10000 ≈ 4.5·10⁻⁵`` of its credit: at real lengths early segments learn almost
nothing. Deriving λ from an effective horizon H in trainable tokens, ``λ = 1 − 1/H``,
makes a segment followed by N trainable tokens keep about ``exp(−N/H)``: the credit
halves every ``H·ln 2`` tokens, whatever the tokenizer or the segment size.

    python -m sapwood.learner.horizon        # the README's credit table
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from sapwood.learner.errors import ConfigError

__all__ = ["DEFAULT_HORIZON_TOKENS", "credit_table", "lam_for_horizon", "segment_credit"]

DEFAULT_HORIZON_TOKENS = 100_000.0
"""Default effective horizon in trainable tokens (λ = 0.99999). About the trainable share of a
~700K-token agent rollout whose context is mostly observations (~15 % model output); a
segment followed by 100K trainable tokens keeps e⁻¹ ≈ 0.37 of its credit."""


def lam_for_horizon(horizon_tokens: float) -> float:
    """``λ = 1 − 1/H`` for an effective horizon of ``H >= 1`` trainable tokens."""
    if not horizon_tokens >= 1.0:
        raise ConfigError(f"horizon_tokens must be >= 1 trainable token, got {horizon_tokens}")
    return 1.0 - 1.0 / float(horizon_tokens)


def segment_credit(trainable_tokens: int, segments: int, *, lam: float, gamma: float = 1.0) -> list[float]:
    """Share of credit ``(γλ)^{N>s}`` each of ``segments`` equal segments of one chain keeps.

    Args:
        trainable_tokens: trainable tokens of the whole trajectory (split evenly, the remainder
            going to the first segments).
        segments: number of compaction segments (>= 1).
        lam: GAE lambda; gamma: discount (both per trainable token).

    Returns:
        ``segments`` floats, the first segment's first; the last segment keeps 1.
    """
    if segments < 1 or trainable_tokens < 0:
        raise ConfigError(f"need segments >= 1 and trainable_tokens >= 0, got {segments}, {trainable_tokens}")
    base, extra = divmod(trainable_tokens, segments)
    sizes = [base + (1 if s < extra else 0) for s in range(segments)]
    gl = gamma * lam
    return [gl ** sum(sizes[s + 1 :]) for s in range(segments)]


def credit_table(
    lengths: Sequence[int] = (10_000, 100_000, 700_000),
    segments: int = 3,
    horizons: Sequence[float | None] = (None, DEFAULT_HORIZON_TOKENS),
) -> str:
    """Markdown table: per trajectory length, the credit each segment keeps under λ = 0.999
    (the previous default), each ``horizons`` entry (None: H = the trajectory's own length)."""
    header = "| trainable tokens | λ | " + " | ".join(f"segment {s + 1}" for s in range(segments)) + " |"
    rows = [header, "|" + "---|" * (segments + 2)]
    for length in lengths:
        arms: list[tuple[str, float]] = [("0.999 (fixed)", 0.999)]
        for h in horizons:
            horizon = float(length) if h is None else float(h)
            name = "H = length" if h is None else f"H = {int(h):,}"
            arms.append((f"1 − 1/H, {name}", lam_for_horizon(horizon)))
        for name, lam in arms:
            credit = segment_credit(length, segments, lam=lam)
            rows.append(f"| {length:,} | {name} | " + " | ".join(_fmt(c) for c in credit) + " |")
    return "\n".join(rows)


def _fmt(x: float) -> str:
    return f"{x:.3f}" if x >= 1e-3 else f"{x:.1e}"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Credit each compaction segment keeps under cross-trajectory GAE.")
    parser.add_argument("--segments", type=int, default=3)
    parser.add_argument("--lengths", type=int, nargs="+", default=[10_000, 100_000, 700_000])
    args = parser.parse_args(argv)
    print(credit_table(args.lengths, args.segments))


if __name__ == "__main__":
    main()
