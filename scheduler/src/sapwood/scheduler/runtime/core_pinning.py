"""Pinning cells to CPU cores where there are enough: one core per cell, one left for everything else.

A cell stands for an accelerator (exclusive); its device clock (:mod:`.device_clock`) already stops a
busy cell from borrowing an idle cell's *modelled* time, but its real computation still runs wherever
the operating system puts it. With at least ``cells + 1`` usable cores each cell gets a core of its own
(the last ones), and the driver, router, store writer and execution hosts keep the rest; with fewer (this
project's 2-core CI machine runs 3 cells) nothing is pinned and the device clocks alone keep cells apart.
Linux only (``os.sched_setaffinity``); elsewhere the plan is empty.
"""

from __future__ import annotations

import os
from collections.abc import Collection

__all__ = ["core_plan", "pin_process", "process_affinity", "usable_cores"]


def usable_cores() -> set[int]:
    """The cores this process may run on (empty where the platform cannot say)."""
    getter = getattr(os, "sched_getaffinity", None)
    return set(getter(0)) if getter is not None else set()


def core_plan(cells: int, available: Collection[int] | None = None) -> list[int] | None:
    """One core per cell (the highest ``cells`` of ``available``, default this process's usable cores), or
    None when fewer than ``cells + 1`` cores are available (one is kept for the driver and the hosts)."""
    if cells < 1:
        raise ValueError(f"a core plan needs ≥ 1 cell, got {cells}")
    cores = sorted(usable_cores() if available is None else set(available))
    if len(cores) < cells + 1:
        return None
    return cores[-cells:]


def pin_process(core: int) -> set[int]:
    """Pin every thread of this process (and threads it starts later) to ``core``; returns the affinity
    read back. Raises ``ValueError`` for a core this process may not use."""
    if core not in usable_cores():
        raise ValueError(f"core {core} is not one this process may use: {sorted(usable_cores())}")
    for tid in _threads():
        try:
            os.sched_setaffinity(tid, {core})
        except ProcessLookupError:  # the thread ended between the listing and the call
            continue
    return process_affinity()


def process_affinity() -> set[int]:
    """The union of every thread's affinity in this process."""
    cores: set[int] = set()
    for tid in _threads():
        try:
            cores |= os.sched_getaffinity(tid)
        except ProcessLookupError:
            continue
    return cores


def _threads() -> list[int]:
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except FileNotFoundError:
        return [0]
