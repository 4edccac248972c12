"""Applying the scheduler's cell events: the ``cells``, ``scheduler_decisions`` and ``switch_phases`` projections.

A cell event names a registered cell (``cell_registered`` first, like ``execution_started`` for an
execution); every effect derives from the event's fields and ``created_at`` only, so a rebuild from the
events gives the same rows.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from sapwood.platform import schema as t
from sapwood.platform.errors import UnknownParentError
from sapwood.platform.events import CellHeartbeat, CellRegistered, Event, RoleAssigned, SwitchPhase


class CellPlan:
    """Cell rows touched by one batch (loaded on first use) and the decision/phase rows to insert."""

    def __init__(self) -> None:
        self.cells: dict[str, dict[str, Any]] = {}
        self.new: set[str] = set()
        self.dirty: set[str] = set()
        self.decisions: list[dict[str, Any]] = []
        self.phases: list[dict[str, Any]] = []

    def cell(self, conn: Connection, event: Event, cell_id: str) -> dict[str, Any]:
        row = self.cells.get(cell_id)
        if row is None:
            found = conn.execute(sa.select(t.cells).where(t.cells.c.cell_id == cell_id)).mappings().first()
            if found is None:
                raise UnknownParentError(
                    f"{event.kind} for unknown cell {cell_id!r}; expected a cell_registered event first",
                    event_id=event.event_id,
                )
            row = self.cells[cell_id] = dict(found)
        return row

    def write(self, conn: Connection) -> None:
        """Insert the batch's cells (a touched existing cell is replaced: a handful of rows per batch)."""
        old = sorted(self.dirty - self.new)
        if old:
            conn.execute(t.cells.delete().where(t.cells.c.cell_id.in_(old)))
        if self.dirty:
            conn.execute(t.cells.insert(), [self.cells[c] for c in sorted(self.dirty)])
        if self.decisions:
            conn.execute(t.scheduler_decisions.insert(), self.decisions)
        if self.phases:
            conn.execute(t.switch_phases.insert(), self.phases)


def _plan_of(plan: Any) -> CellPlan:
    cp: CellPlan | None = getattr(plan, "cell_plan", None)
    if cp is None:
        cp = plan.cell_plan = CellPlan()
    return cp


def h_registered(plan: Any, e: CellRegistered, st: None, refs: dict[str, list[Any]]) -> None:
    cp = _plan_of(plan)
    try:
        row = cp.cell(plan.db(), e, e.cell_id)
    except UnknownParentError:
        cp.cells[e.cell_id] = {
            "cell_id": e.cell_id, "tier": e.tier, "capacity": e.capacity, "role": "idle", "role_since": e.created_at,
            "registered_at": e.created_at, "last_heartbeat_at": e.created_at, "heartbeats": 0, "role_changes": 0,
            "switch_s": 0.0, "last_phase": None, "metadata": e.metadata,
        }
        cp.new.add(e.cell_id)
    else:  # re-registration (a restarted cell): new tier/capacity, alive again, role kept
        row.update(tier=e.tier, capacity=e.capacity, metadata=e.metadata, last_heartbeat_at=e.created_at)
    cp.dirty.add(e.cell_id)


def h_heartbeat(plan: Any, e: CellHeartbeat, st: None, refs: dict[str, list[Any]]) -> None:
    cp = _plan_of(plan)
    row = cp.cell(plan.db(), e, e.cell_id)
    row["last_heartbeat_at"] = max(row["last_heartbeat_at"], e.created_at)
    row["heartbeats"] += 1
    cp.dirty.add(e.cell_id)


def h_role(plan: Any, e: RoleAssigned, st: None, refs: dict[str, list[Any]]) -> None:
    cp = _plan_of(plan)
    row = cp.cell(plan.db(), e, e.cell_id)
    if row["role"] != e.role:
        row["role_changes"] += 1
        row["role_since"] = e.created_at
    row["role"] = e.role
    cp.dirty.add(e.cell_id)
    cp.decisions.append({
        "event_id": e.event_id, "cell_id": e.cell_id, "role": e.role, "previous_role": e.previous_role,
        "reason": e.reason, "policy": e.policy, "signals": e.signals, "decided_at": e.created_at,
    })


def h_phase(plan: Any, e: SwitchPhase, st: None, refs: dict[str, list[Any]]) -> None:
    cp = _plan_of(plan)
    row = cp.cell(plan.db(), e, e.cell_id)
    row["switch_s"] += float(e.duration_s)
    row["last_phase"] = e.phase
    cp.dirty.add(e.cell_id)
    cp.phases.append({"event_id": e.event_id, "cell_id": e.cell_id, "role": e.role, "phase": e.phase,
                      "duration_s": float(e.duration_s), "at": e.created_at})


CELL_HANDLERS: dict[type[Event], Any] = {
    CellRegistered: h_registered,
    CellHeartbeat: h_heartbeat,
    RoleAssigned: h_role,
    SwitchPhase: h_phase,
}


def write_cells(conn: Connection, plan: Any) -> None:
    """Write what the batch's cell events planned (nothing when it had none)."""
    cp: CellPlan | None = getattr(plan, "cell_plan", None)
    if cp is not None:
        cp.write(conn)
