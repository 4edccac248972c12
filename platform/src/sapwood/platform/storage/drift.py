"""Retokenization drift per run: chat calls checked, calls drifted, the rate, and where the drifted calls
first differed (``calls.drift_checked`` / ``calls.drift_at``, set by the gateway).

Dialect-free (the same statements on SQLite and PostgreSQL). Callers own the transaction.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from sapwood.platform import schema as t

_c = t.calls.c
_e = t.executions.c


@dataclass(frozen=True, slots=True)
class RunDrift:
    """One run's drift: ``rate`` = drifted ÷ checked (None when no call was checked, never NaN);
    ``first_position``: the smallest input index at which a drifted call differed (None: no drift)."""

    run_id: str
    calls: int
    checked: int
    drifted: int
    first_position: int | None

    @property
    def rate(self) -> float | None:
        return self.drifted / self.checked if self.checked else None


@dataclass(frozen=True, slots=True)
class DriftedCall:
    """A call whose previous output ids did not come back verbatim: ``position`` indexes its input."""

    call_id: str
    execution_id: str
    seq: int
    position: int


def _per_run() -> sa.Select[Any]:
    """Per run id: calls, checked calls, drifted calls, the smallest drift position."""
    checked = sa.func.coalesce(sa.func.sum(sa.case((_c.drift_checked, 1), else_=0)), 0)
    return (sa.select(_e.run_id, sa.func.count(), checked, sa.func.count(_c.drift_at), sa.func.min(_c.drift_at))
            .select_from(t.calls.join(t.executions, _e.execution_id == _c.execution_id))
            .group_by(_e.run_id).order_by(_e.run_id))


def drift_by_run(conn: Connection, run_id: str | None = None) -> list[RunDrift]:
    """Every run with recorded calls (or only ``run_id``), ordered by run id."""
    q = _per_run() if run_id is None else _per_run().where(_e.run_id == run_id)
    return [RunDrift(str(r), int(n), int(k), int(d), None if p is None else int(p))
            for r, n, k, d, p in conn.execute(q).all()]


def drifted_calls(conn: Connection, run_id: str, *, limit: int) -> list[DriftedCall]:
    """Up to ``limit`` drifted calls of ``run_id``, earliest recorded first."""
    q = (sa.select(_c.call_id, _c.execution_id, _c.seq, _c.drift_at)
         .select_from(t.calls.join(t.executions, _e.execution_id == _c.execution_id))
         .where(_e.run_id == run_id, _c.drift_at.is_not(None))
         .order_by(_c.created_at, _c.execution_id, _c.seq).limit(limit))
    return [DriftedCall(str(c), str(e), int(s), int(p)) for c, e, s, p in conn.execute(q).all()]


def parse_max_rate(text: str) -> Fraction:
    """A drift-rate limit as an exact fraction (``"0.03"`` is 3/100, not the nearest float); in [0, 1]."""
    try:
        limit = Fraction(text.strip())
    except (ValueError, ZeroDivisionError):
        raise ValueError(f"the drift-rate limit must be a number in [0, 1] such as 0.03, got {text!r}") from None
    if not 0 <= limit <= 1:
        raise ValueError(f"the drift-rate limit must be in [0, 1], got {text!r}")
    return limit


def over_limit(runs: Iterable[RunDrift], max_rate: Fraction) -> list[RunDrift]:
    """The runs whose drift rate is above ``max_rate`` (exactly: drifted / checked > max_rate, no float
    rounding; a rate equal to the limit passes); runs with no checked call have no rate and are not over."""
    return [d for d in runs if d.checked and Fraction(d.drifted, d.checked) > max_rate]


__all__ = ["DriftedCall", "RunDrift", "drift_by_run", "drifted_calls", "over_limit", "parse_max_rate"]
