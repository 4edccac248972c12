"""Where a restarted scheduler's recovery time goes, from its log's timestamps.

A campaign death's recovery runs from the SIGKILL to the kind's next progress. For the live scheduler it is
split here in two parts: **start-up** (the SIGKILL to the new process's first log line: the interpreter, its
imports and the respawn), and **first tick** (the first log line, written as the store opens, to the first
``tick`` line: the schema check, the Kafka clients' bootstrap, the first signal read). Timestamps are the
logging module's ``asctime`` (local time, milliseconds).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

__all__ = ["LOG_TIME", "Restart", "line_time", "restart_parts", "summarize"]

#: ``logging``'s default ``asctime`` layout.
LOG_TIME = "%Y-%m-%d %H:%M:%S,%f"
TICK_MARK = ": tick "


def line_time(line: str) -> float | None:
    """Epoch seconds of a log line that starts with an ``asctime`` stamp; None for any other line."""
    try:
        return datetime.strptime(line[:23], LOG_TIME).timestamp()
    except ValueError:
        return None


@dataclass(frozen=True)
class Restart:
    """One scheduler death and its successor: seconds to the successor's first log line and from there to its
    first tick (None when it logged none before the campaign ended)."""

    startup_s: float | None
    first_tick_s: float | None


def _first_times(log: Path) -> tuple[float | None, float | None]:
    first = tick = None
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return None, None
    for line in text.splitlines():
        t = line_time(line)
        if t is None:
            continue
        if first is None:
            first = t
        if TICK_MARK in line:
            tick = t
            break
    return first, tick


def restart_parts(deaths_at: list[float], successors: list[tuple[float, Path]]) -> list[Restart]:
    """For each death (epoch s), the first successor started at or after it (``(start epoch s, its log)``)."""
    out = []
    for died in sorted(deaths_at):
        after = sorted((s for s in successors if s[0] >= died), key=lambda s: s[0])
        if not after:
            out.append(Restart(None, None))
            continue
        first, tick = _first_times(after[0][1])
        out.append(Restart(None if first is None else round(first - died, 3),
                           None if first is None or tick is None else round(tick - first, 3)))
    return out


def summarize(restarts: list[Restart]) -> dict[str, dict[str, float | int]]:
    """``{"startup": {n, median_s, max_s}, "first_tick": {…}}`` over the restarts that reached each part."""
    parts: dict[str, dict[str, float | int]] = {}
    for name, values in (("startup", [r.startup_s for r in restarts]),
                         ("first_tick", [r.first_tick_s for r in restarts])):
        got = [v for v in values if v is not None]
        parts[name] = ({"n": len(got), "median_s": round(statistics.median(got), 2), "max_s": round(max(got), 2)}
                       if got else {"n": 0})
    return parts
