"""The policy contract: a pure function of (signals, current assignment) → target assignment + reasons.

A policy keeps no mutable state between calls; everything it needs about history (when a cell last
moved, the measured switch cost) is in :class:`~sapwood.scheduler.signals.Signals`. Policies are
loaded by import path (``package.module:Class`` or ``package.module.Class``) so the live loop and
the simulator can be pointed at any implementation.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from sapwood.platform.events.cells import CELL_ROLES, CellRole
from sapwood.scheduler.signals import Signals

Assignment = Mapping[str, CellRole]

BUILTIN = {
    "elastic": "sapwood.scheduler.policies.elastic:ElasticPolicy",
    "colocate": "sapwood.scheduler.policies.colocate:ColocatePolicy",
    "async": "sapwood.scheduler.policies.static:AsyncPolicy",
}


@dataclass(frozen=True)
class Decision:
    """The target role of every cell, and for each cell whose role changes, why."""

    target: dict[str, CellRole]
    reasons: dict[str, str] = field(default_factory=dict)

    def moves(self, assignment: Assignment) -> dict[str, tuple[CellRole, CellRole]]:
        """``{cell_id: (from, to)}`` for the cells whose role changes."""
        return {c: (assignment.get(c, "idle"), r) for c, r in self.target.items() if assignment.get(c, "idle") != r}


@runtime_checkable
class Policy(Protocol):
    """What the live loop and the simulator call each tick."""

    name: str

    def initial_assignment(self, cell_ids: Sequence[str]) -> dict[str, CellRole]:
        """The roles cells start in (before any signal)."""
        ...

    def decide(self, signals: Signals, assignment: Assignment) -> Decision:
        """Target roles for every cell in ``signals.cells``."""
        ...


def check_decision(decision: Decision, signals: Signals) -> Decision:
    """Reject a decision that names unknown cells, omits cells or uses an unknown role."""
    ids = {c.cell_id for c in signals.cells}
    if set(decision.target) != ids:
        raise ValueError(
            f"policy decision must assign exactly the known cells; missing {sorted(ids - set(decision.target))}, "
            f"unknown {sorted(set(decision.target) - ids)}"
        )
    bad = {c: r for c, r in decision.target.items() if r not in CELL_ROLES}
    if bad:
        raise ValueError(f"policy decision has unknown roles {bad}; expected one of {CELL_ROLES}")
    return decision


def load_policy(path: str, **kwargs: object) -> Policy:
    """Instantiate a policy from a built-in name (elastic, colocate, async) or an import path."""
    target = BUILTIN.get(path, path)
    if ":" in target:
        module_name, _, attr = target.partition(":")
    else:
        module_name, _, attr = target.rpartition(".")
    if not module_name or not attr:
        raise ValueError(f"policy {path!r}: expected a built-in name {sorted(BUILTIN)} or 'package.module:Class'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"policy {path!r}: cannot import module {module_name!r}: {exc}") from None
    cls = getattr(module, attr, None)
    if cls is None:
        raise ValueError(f"policy {path!r}: module {module_name!r} has no attribute {attr!r}")
    policy = cls(**kwargs)
    if not isinstance(policy, Policy):
        raise ValueError(f"policy {path!r}: {cls!r} does not implement initial_assignment() and decide()")
    return policy
