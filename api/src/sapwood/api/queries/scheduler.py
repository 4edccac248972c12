"""Reads of the scheduler's projections: cells (with liveness) and role decisions (why a cell moved)."""

from __future__ import annotations

import time
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from sapwood.api.queries.cursors import Cursors, check_uuid
from sapwood.platform import schema as t

_c = t.cells.c
_d = t.scheduler_decisions.c


def list_cells(conn: Connection, *, limit: int, cursor: str | None, cursors: Cursors, lost_after_s: float,
               now: float | None = None) -> dict[str, Any]:
    """Cells ordered by id; ``lost`` when the last heartbeat is older than ``lost_after_s``."""
    q = sa.select(t.cells)
    if cursor:
        (after,) = cursors.decode(cursor, "cells", (str,))
        q = q.where(_c.cell_id > after)
    rows = conn.execute(q.order_by(_c.cell_id).limit(limit + 1)).mappings().all()
    more = len(rows) > limit
    rows = rows[:limit]
    now = time.time() if now is None else now
    items = [{**dict(r), "lost": now - r["last_heartbeat_at"] > lost_after_s,
              "silent_s": max(now - r["last_heartbeat_at"], 0.0)} for r in rows]
    return {"items": items, "next_cursor": cursors.encode("cells", rows[-1]["cell_id"]) if more else None}


def list_decisions(conn: Connection, *, limit: int, cursor: str | None, cursors: Cursors, cell_id: str | None = None,
                   role: str | None = None, after: float | None = None, before: float | None = None) -> dict[str, Any]:
    """Role decisions in time order (oldest first), optionally of one cell, one role, a time window [after, before)."""
    q = sa.select(t.scheduler_decisions)
    if cell_id is not None:
        q = q.where(_d.cell_id == cell_id)
    if role is not None:
        q = q.where(_d.role == role)
    if after is not None:
        q = q.where(_d.decided_at >= after)
    if before is not None:
        q = q.where(_d.decided_at < before)
    if cursor:
        at, eid = cursors.decode(cursor, "decisions", (float, str))
        eid = check_uuid(eid)
        q = q.where(sa.or_(_d.decided_at > at, sa.and_(_d.decided_at == at, _d.event_id > eid)))
    rows = conn.execute(q.order_by(_d.decided_at, _d.event_id).limit(limit + 1)).mappings().all()
    more = len(rows) > limit
    rows = rows[:limit]
    nxt = cursors.encode("decisions", rows[-1]["decided_at"], str(rows[-1]["event_id"])) if more else None
    return {"items": [{**dict(r), "event_id": str(r["event_id"])} for r in rows], "next_cursor": nxt}
