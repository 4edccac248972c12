"""The device clock: reservations laid end to end (zero work, back-to-back, concurrent charges), the
batched decode step's cost shares, and a cell whose work ends no earlier than its clock says."""

from __future__ import annotations

import math
import threading
import time
from typing import Any

import pytest

from sapwood.rollout.engines import SamplingParams
from sapwood.scheduler.runtime.cell import Cell
from sapwood.scheduler.runtime.device_clock import DeviceClock, DeviceCosts
from tests.support.elastic_runtime import initial_state, model_config


def test_zero_work_reserves_nothing_even_while_the_device_is_busy() -> None:
    clock = DeviceClock()
    assert clock.reserve(0.0, 5.0) == 5.0
    assert (clock.busy_until, clock.charged_s, clock.charges) == (0.0, 0.0, 0)
    clock.reserve(10.0, 0.0)
    assert clock.reserve(0.0, 3.0) == 3.0, "a zero charge does not queue behind busy work"
    assert clock.busy_until == 10.0
    t0 = time.monotonic()
    clock2 = DeviceClock()
    assert clock2.charge(0.0) <= time.monotonic()
    assert time.monotonic() - t0 < 5.0


def test_back_to_back_charges_are_laid_end_to_end_and_an_idle_gap_is_not_reclaimed() -> None:
    clock = DeviceClock()
    assert clock.reserve(1.0, 0.0) == 1.0
    assert clock.reserve(1.0, 0.5) == 2.0, "work started while the device was busy waits for it"
    assert clock.reserve(0.25, 2.0) == 2.25, "exactly at the boundary: no gap, no overlap"
    assert clock.reserve(1.0, 5.0) == 6.0, "an idle device starts at once; the gap is not banked"
    assert clock.charged_s == pytest.approx(3.25)
    assert clock.charges == 4


@pytest.mark.parametrize("bad", [-1e-9, math.nan, math.inf, -math.inf])
def test_a_charge_must_be_finite_and_non_negative(bad: float) -> None:
    with pytest.raises(ValueError):
        DeviceClock().reserve(bad, 0.0)
    with pytest.raises(ValueError):
        DeviceCosts(decode_token_s=bad)


def test_concurrent_charges_on_one_clock_never_overlap() -> None:
    clock = DeviceClock()
    t0 = time.monotonic()
    ends: list[float] = []
    lock = threading.Lock()

    def work() -> None:
        end = clock.charge(0.05, t0)
        assert time.monotonic() >= end, "a charge returns no earlier than its reservation ends"
        with lock:
            ends.append(end)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(e - t0 for e in ends) == pytest.approx([0.05 * i for i in range(1, 9)])
    assert time.monotonic() - t0 >= 0.4, "8 × 50 ms on one device take ≥ 400 ms, whatever the threads"


def test_a_batched_decode_step_is_shared_by_its_calls() -> None:
    costs = DeviceCosts(decode_token_s=0.01, batch_extra_s=0.004)
    assert costs.decode_step_s(1) == 0.01
    assert costs.decode_step_s(3) == pytest.approx(0.018)
    assert sum(costs.token_share_s(3) for _ in range(3)) == pytest.approx(costs.decode_step_s(3))
    assert costs.token_share_s(2, scale=3.0) == pytest.approx(0.021)
    with pytest.raises(ValueError):
        costs.decode_step_s(0)
    assert DeviceCosts().token_share_s(4) == 0.0


def _cell(costs: DeviceCosts, capacity: int = 2) -> Cell:
    return Cell("c0", model_config(), initial_state(), role="rollout", capacity=capacity, device_costs=costs)


def _generate(cell: Cell, key: str, out: dict[str, Any]) -> None:
    out[key] = cell.generate(key, [1, 2, 3], SamplingParams(max_new_tokens=10, stop_token_ids=()).to_dict())


def test_a_cells_decoding_ends_no_earlier_than_its_device_clock() -> None:
    """Fails when the clock is a no-op: the tiny model decodes 10 tokens in milliseconds."""
    cell = _cell(DeviceCosts(decode_token_s=0.03))
    out: dict[str, Any] = {}
    t0 = time.monotonic()
    _generate(cell, "a", out)
    assert out["a"]["status"] == "ok"
    assert len(out["a"]["output_ids"]) == 10
    assert time.monotonic() - t0 >= 10 * 0.03
    assert cell.status()["device_charged_s"] == pytest.approx(0.3)


def test_concurrent_calls_on_one_cell_share_its_device_but_two_cells_do_not() -> None:
    """Two calls on one cell with no batching gain (extra = one step) take twice one call's device time;
    the same two calls on two cells take one call's each (device time is per cell)."""
    costs = DeviceCosts(decode_token_s=0.02, batch_extra_s=0.02)
    one = _cell(costs)
    out: dict[str, Any] = {}
    threads = [threading.Thread(target=_generate, args=(one, k, out)) for k in ("a", "b")]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    shared_wall = time.monotonic() - t0
    assert [out[k]["status"] for k in ("a", "b")] == ["ok", "ok"]
    assert shared_wall >= 20 * 0.02 - 1e-3, "20 tokens on one device: ≥ 20 single steps, laid end to end"
    assert one.status()["device_charged_s"] == pytest.approx(20 * 0.02), "with no batching gain a share is a step"
    two = [_cell(costs), _cell(costs)]
    out2: dict[str, Any] = {}
    threads = [threading.Thread(target=_generate, args=(c, k, out2)) for c, k in zip(two, ("a", "b"), strict=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert [c.status()["device_charged_s"] for c in two] == pytest.approx([0.2, 0.2])
