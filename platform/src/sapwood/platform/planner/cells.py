"""The scheduler's cell events: the ``cells``, ``scheduler_decisions`` and ``switch_phases`` projections.

A cell event names a registered cell (``cell_registered`` first, like ``execution_started`` for an
execution); every effect derives from the event's fields and ``created_at`` only, so a rebuild from the
events gives the same rows. The handlers in :mod:`.handlers` call the functions here.
"""

from __future__ import annotations

from sapwood.platform.errors import UnknownParentError
from sapwood.platform.events import CellHeartbeat, CellRegistered, Event, RoleAssigned, SwitchPhase
from sapwood.platform.planner.ports import Row, StoredState


class CellEffects:
    """Cell rows touched by one batch (loaded on first use) and the decision/phase rows to insert."""

    def __init__(self, state: StoredState) -> None:
        self._state = state
        self.cells: dict[str, Row] = {}
        self.new: set[str] = set()
        self.dirty: set[str] = set()
        self.decisions: list[Row] = []
        self.phases: list[Row] = []

    def cell(self, event: Event, cell_id: str) -> Row:
        """The row of registered cell ``cell_id`` as the batch left it, or raise."""
        row = self.cells.get(cell_id)
        if row is None:
            found = self._state.cell(cell_id)
            if found is None:
                raise UnknownParentError(
                    f"{event.kind} for unknown cell {cell_id!r}; expected a cell_registered event first",
                    event_id=event.event_id,
                )
            row = self.cells[cell_id] = found
        return row

    def dirty_rows(self) -> list[Row]:
        """Rows of every cell the batch touched, by id (each replaces the stored row)."""
        return [self.cells[c] for c in sorted(self.dirty)]

    def replaced(self) -> list[str]:
        """Ids of the stored cells the batch touched (their rows are replaced)."""
        return sorted(self.dirty - self.new)


def registered(cp: CellEffects, e: CellRegistered) -> None:
    try:
        row = cp.cell(e, e.cell_id)
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


def heartbeat(cp: CellEffects, e: CellHeartbeat) -> None:
    row = cp.cell(e, e.cell_id)
    row["last_heartbeat_at"] = max(row["last_heartbeat_at"], e.created_at)
    row["heartbeats"] += 1
    cp.dirty.add(e.cell_id)


def role_assigned(cp: CellEffects, e: RoleAssigned) -> None:
    row = cp.cell(e, e.cell_id)
    if row["role"] != e.role:
        row["role_changes"] += 1
        row["role_since"] = e.created_at
    row["role"] = e.role
    cp.dirty.add(e.cell_id)
    cp.decisions.append({
        "event_id": e.event_id, "cell_id": e.cell_id, "role": e.role, "previous_role": e.previous_role,
        "reason": e.reason, "policy": e.policy, "signals": e.signals, "decided_at": e.created_at,
    })


def switch_phase(cp: CellEffects, e: SwitchPhase) -> None:
    row = cp.cell(e, e.cell_id)
    row["switch_s"] += float(e.duration_s)
    row["last_phase"] = e.phase
    cp.dirty.add(e.cell_id)
    cp.phases.append({"event_id": e.event_id, "cell_id": e.cell_id, "role": e.role, "phase": e.phase,
                      "duration_s": float(e.duration_s), "at": e.created_at})


__all__ = ["CellEffects", "heartbeat", "registered", "role_assigned", "switch_phase"]
