"""The elastic scheduler's cell events: registration, heartbeats, role assignments, switch phases.

Keyed by ``cell_id`` and not scoped to an execution (like ``policy_published``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from sapwood.platform.errors import ValidationError
from sapwood.platform.events.base import UnscopedEvent

__all__ = ["CELL_ROLES", "CELL_TIERS", "CellHeartbeat", "CellRegistered", "CellRole", "CellTier", "RoleAssigned",
           "SwitchPhase"]

CellRole = Literal["rollout", "train", "idle"]
"""What a cell does now (a cell's role; a node's role is :class:`sapwood.platform.tree.Role`)."""
CellTier = Literal["core", "satellite"]
"""A core cell holds authoritative learner state; a satellite joins and leaves."""
CELL_ROLES: tuple[CellRole, ...] = ("rollout", "train", "idle")
CELL_TIERS: tuple[CellTier, ...] = ("core", "satellite")


@dataclass(eq=False, kw_only=True)
class _CellEvent(UnscopedEvent):
    """Base of the scheduler's cell events: keyed by ``cell_id``, not scoped to an execution (like
    ``policy_published``: execution_id and seq stay None; Kafka partitions them by cell id)."""

    scope: ClassVar[str] = "cell"

    cell_id: str

    def _validate_fields(self) -> None:
        if not isinstance(self.cell_id, str) or not 0 < len(self.cell_id) <= 128:
            raise ValidationError(f"{self.kind}.cell_id must be a non-empty string (≤ 128 chars), got {self.cell_id!r}")
        self._validate_cell()

    def _validate_cell(self) -> None:
        """Kind-specific checks."""


@dataclass(eq=False, kw_only=True)
class CellRegistered(_CellEvent):
    """A cell joined the cluster: its tier and its rollout capacity (concurrent rollouts it serves)."""

    kind: ClassVar[str] = "cell_registered"

    tier: CellTier = "core"
    capacity: int = 1
    metadata: dict[str, Any] = field(default_factory=dict)

    def _validate_cell(self) -> None:
        if self.tier not in CELL_TIERS:
            raise ValidationError(f"cell_registered.tier must be one of {CELL_TIERS}, got {self.tier!r}")
        if not isinstance(self.capacity, int) or isinstance(self.capacity, bool) or self.capacity < 1:
            raise ValidationError(f"cell_registered.capacity must be an integer ≥ 1, got {self.capacity!r}")


@dataclass(eq=False, kw_only=True)
class CellHeartbeat(_CellEvent):
    """A cell is alive (its time is ``created_at``); ``status`` carries optional figures (e.g. busy slots)."""

    kind: ClassVar[str] = "cell_heartbeat"

    status: dict[str, Any] = field(default_factory=dict)


@dataclass(eq=False, kw_only=True)
class RoleAssigned(_CellEvent):
    """The scheduler gave ``cell_id`` a role, with the signal snapshot it decided on and why."""

    kind: ClassVar[str] = "role_assigned"

    role: CellRole
    previous_role: CellRole = "idle"
    reason: str = ""
    policy: str = ""
    signals: dict[str, Any] = field(default_factory=dict)

    def _validate_cell(self) -> None:
        for name in ("role", "previous_role"):
            if getattr(self, name) not in CELL_ROLES:
                raise ValidationError(f"role_assigned.{name} must be one of {CELL_ROLES}, got {getattr(self, name)!r}")


@dataclass(eq=False, kw_only=True)
class SwitchPhase(_CellEvent):
    """One phase of a role switch (e.g. drain, migrate, load) and how long it took."""

    kind: ClassVar[str] = "switch_phase"

    phase: str
    duration_s: float
    role: CellRole = "idle"

    def _validate_cell(self) -> None:
        if not isinstance(self.phase, str) or not 0 < len(self.phase) <= 64:
            raise ValidationError(f"switch_phase.phase must be a non-empty string of ≤ 64 chars, got {self.phase!r}")
        d = self.duration_s
        if isinstance(d, bool) or not isinstance(d, int | float) or not math.isfinite(d) or d < 0:
            raise ValidationError(f"switch_phase.duration_s must be a finite number ≥ 0, got {d!r}")
        if self.role not in CELL_ROLES:
            raise ValidationError(f"switch_phase.role must be one of {CELL_ROLES}, got {self.role!r}")
