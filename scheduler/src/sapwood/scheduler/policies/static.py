"""Async baseline: a static disjoint split of rollout and training cells."""

from __future__ import annotations

from collections.abc import Sequence

from sapwood.platform.events.cells import CellRole
from sapwood.scheduler.policies.common import start_decision
from sapwood.scheduler.policy import Assignment, Decision
from sapwood.scheduler.signals import Signals


class AsyncPolicy:
    """``rollout_cells`` (or ``rollout_fraction`` of the cells) generate; the rest train. Never moves a cell.

    ``max_staleness`` bounds how many policy versions a trajectory may lag when trained (the simulator's
    admission control enforces it).
    """

    name = "async"

    def __init__(self, rollout_cells: int | None = None, rollout_fraction: float = 0.5, max_staleness: int = 1):
        if rollout_cells is not None and rollout_cells < 1:
            raise ValueError(f"AsyncPolicy.rollout_cells must be ≥ 1, got {rollout_cells}")
        if not 0.0 < rollout_fraction < 1.0:
            raise ValueError(f"AsyncPolicy.rollout_fraction must be in (0, 1), got {rollout_fraction}")
        if max_staleness < 0:
            raise ValueError(f"AsyncPolicy.max_staleness must be ≥ 0, got {max_staleness}")
        self.rollout_cells = rollout_cells
        self.rollout_fraction = rollout_fraction
        self.max_staleness = max_staleness

    def initial_assignment(self, cell_ids: Sequence[str]) -> dict[str, CellRole]:
        n = len(cell_ids)
        if n < 2:
            raise ValueError(f"AsyncPolicy needs ≥ 2 cells (one per role), got {n}")
        r = self.rollout_cells if self.rollout_cells is not None else round(n * self.rollout_fraction)
        r = min(max(r, 1), n - 1)
        return {cid: ("rollout" if i < r else "train") for i, cid in enumerate(cell_ids)}

    def decide(self, signals: Signals, assignment: Assignment) -> Decision:
        target, reasons, _ = start_decision(signals, assignment)
        return Decision(target, reasons)
