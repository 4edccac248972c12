"""The long-tail workload: stratified per batch, so every batch holds its own Pareto tail."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sapwood.demo.elastic.workload import LongTailWorkload


def test_every_batch_has_its_tail_and_the_run_follows_the_pareto() -> None:
    w = LongTailWorkload(batch_size=8, alpha=1.3, cap=12.0)
    scales = w.scales(8 * 200, seed=0)
    assert len(scales) == 1600
    assert min(scales) >= 1.0
    assert max(scales) <= 12.0
    q = float(w.quantile(np.array([7 / 8]))[0])  # the top stratum starts here
    for i in range(0, len(scales), 8):
        assert max(scales[i:i + 8]) >= q, f"batch {i // 8} has no draw from its top stratum"
    # the run's empirical CDF matches the clipped Pareto's at a few points
    for x in (1.5, 2.0, 4.0):
        assert abs(np.mean(np.array(scales) <= x) - (1 - x ** -1.3)) < 0.01
    assert np.mean(np.array(scales) == 12.0) == pytest.approx(12.0 ** -1.3, abs=0.01)
    assert w.tail_share(scales) > 0.3, "the longest execution of each batch holds a heavy share of its length"


def test_the_draw_is_reproducible_and_seeded() -> None:
    w = LongTailWorkload()
    assert w.scales(20, seed=3) == w.scales(20, seed=3)
    assert w.scales(20, seed=3) != w.scales(20, seed=4)
    assert w.scales(20, seed=3)[:16] == w.scales(16, seed=3), "a longer run extends a shorter one"


def test_boundaries() -> None:
    assert LongTailWorkload().scales(0, seed=0) == []
    assert len(LongTailWorkload(batch_size=8).scales(5, seed=0)) == 5, "a partial last batch"
    one = LongTailWorkload(batch_size=1, alpha=2.0, cap=1.0).scales(10, seed=0)
    assert one == [1.0] * 10, "cap 1: no tail at all"
    w = LongTailWorkload(alpha=0.5, cap=1e6)
    q = w.quantile(np.array([0.0, 0.5, 1 - 1e-12]))
    assert q[0] == 1.0
    assert q[1] == pytest.approx(4.0)
    assert q[2] == 1e6, "clipped at the cap, never inf"
    assert all(math.isfinite(x) for x in w.scales(1000, seed=1))
    assert LongTailWorkload().tail_share([]) == 0.0


@pytest.mark.parametrize(("kw", "match"), [
    ({"batch_size": 0}, "batch_size must be ≥ 1"),
    ({"alpha": 0.0}, "alpha must be a finite number > 0"),
    ({"alpha": float("nan")}, "alpha must be a finite number > 0"),
    ({"cap": 0.5}, "cap must be a finite number ≥ 1"),
    ({"cap": float("inf")}, "cap must be a finite number ≥ 1"),
    ({"staleness_bound": 2}, "staleness bound 0 or 1"),
])
def test_invalid_workloads_are_refused(kw: dict[str, float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        LongTailWorkload(**kw)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="n must be ≥ 0"):
        LongTailWorkload().scales(-1, seed=0)
