"""Reads of the scheduler's projections: cells and role decisions, in key order, a page at a time.

Portable SQL over ``cells`` and ``scheduler_decisions`` (the same on SQLite and PostgreSQL). A page is
asked for with the key of the last row of the previous page (exclusive) and returns at most ``limit``
rows as dicts of the table's columns.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from sapwood.platform import schema as t

_c = t.cells.c
_d = t.scheduler_decisions.c


def cells(conn: Connection, *, after: str | None = None, limit: int | None = None) -> list[dict[str, Any]]:
    """Cells ordered by ``cell_id``, those after ``after``; all of them without ``limit``."""
    q = sa.select(t.cells)
    if after is not None:
        q = q.where(_c.cell_id > after)
    q = q.order_by(_c.cell_id)
    if limit is not None:
        q = q.limit(limit)
    return [dict(r) for r in conn.execute(q).mappings()]


def decisions(conn: Connection, *, limit: int, cell_id: str | None = None, role: str | None = None,
              decided_from: float | None = None, decided_before: float | None = None,
              after: tuple[float, str] | None = None) -> list[dict[str, Any]]:
    """Role decisions ordered by ``(decided_at, event_id)``: optionally of one cell, one role, decided in
    ``[decided_from, decided_before)``, and after the key ``after``; ``event_id`` as a string."""
    q = sa.select(t.scheduler_decisions)
    if cell_id is not None:
        q = q.where(_d.cell_id == cell_id)
    if role is not None:
        q = q.where(_d.role == role)
    if decided_from is not None:
        q = q.where(_d.decided_at >= decided_from)
    if decided_before is not None:
        q = q.where(_d.decided_at < decided_before)
    if after is not None:
        at, eid = after
        q = q.where(sa.or_(_d.decided_at > at, sa.and_(_d.decided_at == at, _d.event_id > eid)))
    rows = conn.execute(q.order_by(_d.decided_at, _d.event_id).limit(limit)).mappings()
    return [{**dict(r), "event_id": str(r["event_id"])} for r in rows]
