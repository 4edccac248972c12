"""Which process the training chaos campaign's next random kill hits (``campaign.pick_victim``)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, cast

import pytest

from sapwood.demo.chaos.campaign import STARTUP_S, Proc, pick_victim

NOW = 100.0


def proc(kind: str, slot: int = 0, *, fault: str | None = None, age_s: float = 60.0, ticks: int = 1) -> Proc:
    return Proc(kind, slot, cast(Any, None), fault, NOW - age_s, Path(f"{kind}{slot}.log"), ticks=ticks)


def test_a_kind_not_killed_yet_goes_first() -> None:
    procs = [proc("worker", 0), proc("worker", 1), proc("learner")]
    for seed in range(20):
        assert pick_victim(procs, {"worker"}, 5, NOW, random.Random(seed)) is procs[2]


def test_a_kind_whose_ready_processes_are_all_armed_is_killed_armed() -> None:
    """The learners of a short run stay armed for most of it: the kill takes an armed one rather than wait."""
    learner = proc("learner", fault="learner.after_step@2")
    procs = [proc("worker"), learner]
    assert pick_victim(procs, {"worker"}, 5, NOW, random.Random(0)) is learner


def test_unarmed_processes_are_preferred_over_armed_ones() -> None:
    armed = proc("worker", 0, fault="rollout.after_claim@1")
    plain = proc("worker", 1)
    for seed in range(20):
        assert pick_victim([armed, plain], set(), 5, NOW, random.Random(seed)) is plain
        assert pick_victim([armed, plain], {"worker"}, 5, NOW, random.Random(seed)) is plain


@pytest.mark.parametrize("kind", sorted(STARTUP_S))
def test_a_process_within_its_start_up_is_not_a_candidate(kind: str) -> None:
    young = proc(kind, age_s=STARTUP_S[kind])  # exactly at the edge: still starting
    assert pick_victim([young], set(), 5, NOW, random.Random(0)) is None
    old = proc(kind, age_s=STARTUP_S[kind] + 1e-3)
    assert pick_victim([old], set(), 5, NOW, random.Random(0)) is old


def test_a_scheduler_before_its_first_tick_is_not_a_candidate() -> None:
    assert pick_victim([proc("scheduler", ticks=0)], set(), 5, NOW, random.Random(0)) is None


def test_the_last_kills_wait_for_the_kinds_not_killed_yet() -> None:
    starting = proc("learner", age_s=1.0)  # not ready: a learner imports torch first
    worker = proc("worker")
    procs = [worker, starting]
    assert pick_victim(procs, {"worker"}, 1, NOW, random.Random(0)) is None  # the one kill left is the learner's
    assert pick_victim(procs, {"worker"}, 2, NOW, random.Random(0)) is worker  # one to spare
    assert pick_victim(procs, {"worker", "learner"}, 1, NOW, random.Random(0)) is worker
