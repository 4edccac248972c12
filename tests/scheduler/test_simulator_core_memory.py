"""Core size set by memory: the cells the authoritative training state needs."""

from __future__ import annotations

import math

import pytest

from sapwood.scheduler.simulator.workload import PAPER, core_cells_for_memory

GIB = 2.0**30


def test_state_that_fills_a_cell_exactly_needs_one_and_one_byte_more_needs_two() -> None:
    assert core_cells_for_memory(GIB, 1.0, bytes_per_param=1.0, usable_fraction=1.0) == 1
    assert core_cells_for_memory(GIB + 1, 1.0, bytes_per_param=1.0, usable_fraction=1.0) == 2
    assert core_cells_for_memory(2 * GIB, 1.0, bytes_per_param=1.0, usable_fraction=1.0) == 2
    assert core_cells_for_memory(1.0, 1.0, bytes_per_param=1.0) == 1  # never fewer than one core cell


def test_usable_fraction_and_bytes_per_param_scale_the_need() -> None:
    # 0.5 GiB of state in half of a 1 GiB cell fits exactly; the default 16 B/param needs 16× the cells.
    assert core_cells_for_memory(GIB / 2, 1.0, bytes_per_param=1.0, usable_fraction=0.5) == 1
    assert core_cells_for_memory(GIB, 1.0, bytes_per_param=1.0, usable_fraction=0.5) == 2
    assert core_cells_for_memory(GIB, 1.0, usable_fraction=1.0) == 16


def test_the_paper_preset_core_is_what_a_60b_model_on_640_gib_cells_needs() -> None:
    assert core_cells_for_memory(60e9, 640.0) == PAPER.core_cells == 2
    assert core_cells_for_memory(32e9, 640.0) == 1
    assert core_cells_for_memory(72e9, 640.0) == 3


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf])
def test_bad_sizes_are_rejected(bad: float) -> None:
    for kwargs in ({"params": bad, "cell_memory_gib": 640.0}, {"params": 1e9, "cell_memory_gib": bad},
                   {"params": 1e9, "cell_memory_gib": 640.0, "bytes_per_param": bad}):
        with pytest.raises(ValueError, match="finite and > 0"):
            core_cells_for_memory(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [0.0, 1.5, math.nan])
def test_a_usable_fraction_outside_zero_one_is_rejected(bad: float) -> None:
    with pytest.raises(ValueError, match="usable_fraction"):
        core_cells_for_memory(1e9, 640.0, usable_fraction=bad)
