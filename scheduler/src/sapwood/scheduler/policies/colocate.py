"""Colocate baseline: every cell generates a batch, then every cell trains on it (synchronous, on-policy)."""

from __future__ import annotations

from collections.abc import Sequence

from sapwood.platform.events.cells import CellRole
from sapwood.scheduler.policies.common import all_to
from sapwood.scheduler.policy import Assignment, Decision
from sapwood.scheduler.signals import Signals


class ColocatePolicy:
    """All cells train while a step is active or a full batch waits; otherwise all cells generate.

    ``max_staleness`` is the simulator's admission bound: 0 (the default, the synchronous on-policy
    colocate) admits exactly one batch per policy version; 1 lets the next batch's rollouts start while the
    current batch's tail finishes (what the live demo admits for every schedule, so its comparison passes it);
    it needs ``batch_rule="first_finished"``: with exact batches every cell would train on a batch not yet whole.
    """

    name = "colocate"
    #: every cell holds the parameters and takes both roles in turn: no core cell is pinned to training
    pins_core = False
    #: no cell trains while a batch is generated, so there is nothing to accumulate early
    can_stream = False

    def __init__(self, max_staleness: int = 0) -> None:
        if max_staleness < 0:
            raise ValueError(f"ColocatePolicy.max_staleness must be ≥ 0, got {max_staleness}")
        self.max_staleness = max_staleness

    def initial_assignment(self, cell_ids: Sequence[str]) -> dict[str, CellRole]:
        return dict.fromkeys(cell_ids, "rollout")

    def decide(self, signals: Signals, assignment: Assignment) -> Decision:
        if signals.train_active or signals.backlog_executions >= signals.batch_size:
            return all_to("train", signals, assignment, f"colocate: batch of {signals.batch_size} ready, all train")
        return all_to("rollout", signals, assignment, "colocate: no batch to train, all generate")
