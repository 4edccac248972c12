"""The scheduler's recovery split from its log's timestamps: start-up, then the first tick."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from sapwood.demo.chaos.restart_parts import Restart, line_time, restart_parts, summarize

T0 = datetime(2026, 12, 4, 19, 53, 0).timestamp()


def stamp(t: float) -> str:
    return datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S,%f")[:23]


def write_log(path: Path, lines: list[tuple[float, str]]) -> Path:
    path.write_text("".join(f"{stamp(t)} INFO {msg}\n" for t, msg in lines) + "Traceback (most recent call last):\n")
    return path


def test_line_time_reads_the_logging_stamp_to_the_millisecond() -> None:
    assert line_time(f"{stamp(T0 + 1.25)} INFO x: y") == pytest.approx(T0 + 1.25, abs=1e-6)
    assert line_time("Traceback (most recent call last):") is None
    assert line_time("") is None


def test_each_death_is_split_by_its_successor_s_first_line_and_first_tick(tmp_path: Path) -> None:
    first = write_log(tmp_path / "s1.log", [(T0 + 0.5, "alembic: setup"),
                                           (T0 + 0.9, "sapwood.scheduler.live_loop: tick 0")])
    second = write_log(tmp_path / "s2.log", [(T0 + 12.0, "alembic: setup"), (T0 + 13.0, "kafka: connected"),
                                            (T0 + 40.0, "sapwood.scheduler.live_loop: tick 0: 0 moves"),
                                            (T0 + 40.5, "sapwood.scheduler.live_loop: tick 1: 0 moves")])
    # died at T0 + 10; the successor started at T0 + 10 exactly (the boundary counts) and logged at + 12
    parts = restart_parts([T0 + 10.0], [(T0, first), (T0 + 10.0, second)])
    assert parts == [Restart(startup_s=2.0, first_tick_s=28.0)]


def test_a_successor_with_no_tick_or_no_line_reaches_fewer_parts(tmp_path: Path) -> None:
    silent = tmp_path / "s.log"
    silent.write_text("")
    no_tick = write_log(tmp_path / "n.log", [(T0 + 3.0, "alembic: setup")])
    parts = restart_parts([T0, T0 + 5.0, T0 + 100.0], [(T0 + 1.0, no_tick), (T0 + 6.0, silent)])
    assert parts == [Restart(3.0, None), Restart(None, None), Restart(None, None)]
    summary = summarize(parts)
    assert summary == {"startup": {"n": 1, "median_s": 3.0, "max_s": 3.0}, "first_tick": {"n": 0}}


def test_summarize_gives_median_and_max_per_part() -> None:
    summary = summarize([Restart(1.0, 40.0), Restart(3.0, 2.0), Restart(2.0, 6.0)])
    assert summary == {"startup": {"n": 3, "median_s": 2.0, "max_s": 3.0},
                       "first_tick": {"n": 3, "median_s": 6.0, "max_s": 40.0}}
