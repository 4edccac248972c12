"""Helpers every policy shares: lost cells go idle, switching cells keep their target."""

from __future__ import annotations

from sapwood.platform.events.cells import CellRole
from sapwood.scheduler.policy import Assignment, Decision
from sapwood.scheduler.signals import Signals


def start_decision(signals: Signals, assignment: Assignment) -> tuple[dict[str, CellRole], dict[str, str], list[str]]:
    """Copy the assignment, send lost cells to idle, and return the cells a policy may move.

    Returns ``(target, reasons, movable)``; ``movable`` excludes lost and switching cells.
    """
    target: dict[str, CellRole] = {}
    reasons: dict[str, str] = {}
    movable: list[str] = []
    for cell in signals.cells:
        current = assignment.get(cell.cell_id, cell.role)
        target[cell.cell_id] = current
        if cell.lost:
            if current != "idle":
                target[cell.cell_id] = "idle"
                reasons[cell.cell_id] = (
                    f"lost: no heartbeat since t={cell.last_heartbeat_s:.1f}s (now t={signals.at_s:.1f}s)"
                )
        elif not cell.switching:
            movable.append(cell.cell_id)
    return target, reasons, movable


def all_to(role: CellRole, signals: Signals, assignment: Assignment, reason: str) -> Decision:
    """Every movable cell to ``role``."""
    target, reasons, movable = start_decision(signals, assignment)
    for cid in movable:
        if target[cid] != role:
            target[cid] = role
            reasons[cid] = reason
    return Decision(target, reasons)
