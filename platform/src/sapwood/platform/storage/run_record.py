"""Reads of what a run recorded, per execution and per cell: what the elastic runtime's checks compare.

Portable SQL (the same on SQLite and PostgreSQL); callers own the transaction. Execution ids come back
in canonical UUID text, as events carry them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from sapwood.platform import schema as t
from sapwood.platform.uuids import canonical_uuid

__all__ = ["CallCounts", "ExecutionRecord", "call_counts", "cell_roles", "execution_records", "rerouted_calls",
           "switch_phase_names"]


@dataclass(frozen=True)
class ExecutionRecord:
    """One stored execution: its status (``running`` until it finished), message, call count and metadata."""

    execution_id: str
    status: str
    message: str
    n_calls: int
    metadata: dict[str, Any]


@dataclass(frozen=True)
class CallCounts:
    """Model calls stored for one execution: all of them, the action calls, and their distinct ``seq``s."""

    calls: int
    actions: int
    distinct_seq: int


def execution_records(conn: Connection) -> dict[str, ExecutionRecord]:
    """Every stored execution, by execution id."""
    e = t.executions.c
    rows = conn.execute(sa.select(e.execution_id, e.status, e.message, e.n_calls, e.metadata))
    return {canonical_uuid(str(eid)): ExecutionRecord(canonical_uuid(str(eid)), str(status), str(message),
                                                      int(n), dict(meta or {}))
            for eid, status, message, n, meta in rows}


def call_counts(conn: Connection) -> dict[str, CallCounts]:
    """Call counts of every execution with at least one stored call, by execution id."""
    c = t.calls.c
    actions = sa.func.sum(sa.case((c.call_kind == "action", 1), else_=0))
    q = sa.select(c.execution_id, sa.func.count(), actions, sa.func.count(sa.distinct(c.seq))).group_by(
        c.execution_id)
    return {canonical_uuid(str(eid)): CallCounts(int(n), int(a or 0), int(d)) for eid, n, a, d in conn.execute(q)}


def rerouted_calls(conn: Connection) -> int:
    """Stored model calls that took more than one attempt (``timings["attempts"]`` > 1: an attempt was aborted
    or lost and the call was served again, continuing from its kept partial output)."""
    c = t.calls.c
    return sum(1 for (timings,) in conn.execute(sa.select(c.timings))
               if float((timings or {}).get("attempts", 1)) > 1)


def switch_phase_names(conn: Connection, cell_id: str) -> set[str]:
    """Names of the switch phases recorded for ``cell_id`` (any switch)."""
    c = t.switch_phases.c
    return {str(p) for (p,) in conn.execute(sa.select(c.phase).where(c.cell_id == cell_id))}


def cell_roles(conn: Connection) -> dict[str, str]:
    """cell id → its role in the ``cells`` projection."""
    c = t.cells.c
    return {str(cid): str(role) for cid, role in conn.execute(sa.select(c.cell_id, c.role))}
