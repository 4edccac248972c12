"""Phase timing: laps less overlapping work, credits, per-batch figures and totals."""

from __future__ import annotations

import pytest

from sapwood.platform.phase_timer import PhaseTimer


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_laps_exclude_overlapping_work_and_credits_add_up() -> None:
    clock = FakeClock()
    timer = PhaseTimer(clock)
    batch = timer.start()
    clock.now += 2.0
    assert timer.lap("lookups") == pytest.approx(2.0)
    clock.now += 3.0
    assert timer.lap("plan", exclude=1.25) == pytest.approx(1.75)  # 1.25 s were spent streaming spans
    timer.add("spans", 1.25)
    clock.now += 0.5
    assert timer.lap("store", exclude=0.5) == 0.0  # all of it building payloads: exactly on the boundary
    timer.add("payloads", 0.5)
    assert batch == {"lookups": 2.0, "plan": 1.75, "spans": 1.25, "store": 0.0, "payloads": 0.5}
    assert sum(batch.values()) == pytest.approx(5.5)  # the phases sum to the wall time


def test_start_begins_a_fresh_batch_and_totals_accumulate() -> None:
    clock = FakeClock()
    timer = PhaseTimer(clock)
    first = timer.start()
    clock.now += 1.0
    timer.lap("plan")
    second = timer.start()
    clock.now += 4.0  # the lap starts at start(), not at the previous batch's last lap
    timer.lap("plan")
    timer.add("store", 0.5)
    assert first == {"plan": 1.0}
    assert second == {"plan": 4.0, "store": 0.5}
    assert timer.batch is second
    assert timer.totals == {"plan": 5.0, "store": 0.5}
