"""Reads of the scheduler's projections: cells (with liveness) and role decisions (why a cell moved)."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy.engine import Connection

from sapwood.api.cursors import Cursors, check_uuid
from sapwood.platform.storage.cells import cells as stored_cells
from sapwood.platform.storage.cells import decisions as stored_decisions


def list_cells(conn: Connection, *, limit: int, cursor: str | None, cursors: Cursors, lost_after_s: float,
               now: float | None = None) -> dict[str, Any]:
    """Cells ordered by id; ``lost`` when the last heartbeat is older than ``lost_after_s``."""
    after = cursors.decode(cursor, "cells", (str,))[0] if cursor else None
    rows = stored_cells(conn, after=after, limit=limit + 1)
    more = len(rows) > limit
    rows = rows[:limit]
    now = time.time() if now is None else now
    items = [{**r, "lost": now - r["last_heartbeat_at"] > lost_after_s,
              "silent_s": max(now - r["last_heartbeat_at"], 0.0)} for r in rows]
    return {"items": items, "next_cursor": cursors.encode("cells", rows[-1]["cell_id"]) if more else None}


def list_decisions(conn: Connection, *, limit: int, cursor: str | None, cursors: Cursors, cell_id: str | None = None,
                   role: str | None = None, after: float | None = None, before: float | None = None) -> dict[str, Any]:
    """Role decisions in time order (oldest first), optionally of one cell, one role, a time window [after, before)."""
    key = None
    if cursor:
        at, eid = cursors.decode(cursor, "decisions", (float, str))
        key = (at, check_uuid(eid))
    rows = stored_decisions(conn, limit=limit + 1, cell_id=cell_id, role=role, decided_from=after,
                            decided_before=before, after=key)
    more = len(rows) > limit
    rows = rows[:limit]
    nxt = cursors.encode("decisions", rows[-1]["decided_at"], rows[-1]["event_id"]) if more else None
    return {"items": rows, "next_cursor": nxt}
