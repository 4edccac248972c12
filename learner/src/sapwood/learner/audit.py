"""Exactly-once audit of a training run, from the store alone (and the checkpoint files it names).

:func:`audit_training` checks what a crash must never break: every execution of the run's queue was
trained in exactly one published version (none skipped, none twice), the versions are contiguous,
each version's checkpoint loads with the digest that was published and holds that version, and the
trainer step count of each version is the number of batches committed up to it (a step lost or
replayed by a restart would break the count).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from sapwood.learner.checkpoint import CheckpointError, read_checkpoint
from sapwood.platform.storage.learner_reads import policy_history, run_item_states
from sapwood.platform.store import Store

__all__ = ["TrainingAudit", "audit_training"]


@dataclass
class TrainingAudit:
    """Findings of :func:`audit_training`; :attr:`ok` when none of the lists has an entry."""

    versions: list[int]
    items: int
    """Executions in the run's queue."""
    trained: int
    """Executions named by a published version (trained or excluded by the reward policy)."""
    skipped: list[str] = field(default_factory=list)
    """Queued executions no published version names."""
    duplicated: list[str] = field(default_factory=list)
    """Executions named by more than one version (or twice by one)."""
    not_done: list[str] = field(default_factory=list)
    """Executions a version names whose queue item is not ``done``."""
    gaps: list[int] = field(default_factory=list)
    """Versions missing between the first and the last."""
    bad_checkpoints: list[str] = field(default_factory=list)
    """``version: reason`` for each checkpoint that is missing, mismatched or holds another version."""
    step_mismatches: list[int] = field(default_factory=list)
    """Versions whose trainer step count is not the first version's offset plus the batches committed
    up to them."""

    @property
    def ok(self) -> bool:
        return not (self.skipped or self.duplicated or self.not_done or self.gaps or self.bad_checkpoints
                    or self.step_mismatches)

    def summary(self) -> dict[str, Any]:
        """Counts, for a JSON line."""
        return {"versions": len(self.versions), "items": self.items, "trained": self.trained,
                "skipped": len(self.skipped), "duplicated": len(self.duplicated), "not_done": len(self.not_done),
                "version_gaps": len(self.gaps), "bad_checkpoints": len(self.bad_checkpoints),
                "step_mismatches": len(self.step_mismatches), "ok": self.ok}


def audit_training(store: Store, run_id: str, *, publish_run_id: str | None = None,
                   expect_all_trained: bool = True) -> TrainingAudit:
    """Audit the versions ``publish_run_id`` (default ``run_id``) published from ``run_id``'s queue.

    ``expect_all_trained``: every queued execution must be named (else only those named are checked).
    """
    with store.transaction() as conn:
        history = policy_history(conn, publish_run_id or run_id)
        states = run_item_states(conn, run_id)
    history = [h for h in history if h[2].get("train_run", run_id) == run_id and "execution_ids" in h[2]]
    named: Counter[str] = Counter()
    audit = TrainingAudit(versions=[v for v, _, _ in history], items=len(states), trained=0)
    committed = 0  # batches committed up to this version
    offset: int | None = None  # trainer steps before the first audited version's batches
    for version, path, meta in history:
        named.update(meta["execution_ids"])
        named.update(meta.get("excluded_execution_ids", []))
        steps = int(meta.get("steps", -1))
        committed += int(meta.get("batches", 0))
        offset = steps - committed if offset is None else offset
        if steps != offset + committed:
            audit.step_mismatches.append(version)
        digest = str(meta.get("digest", ""))
        if not digest:
            audit.bad_checkpoints.append(f"{version}: published without a digest")
            continue
        try:
            state = read_checkpoint(path, digest)
        except CheckpointError as exc:
            audit.bad_checkpoints.append(f"{version}: {exc}")
            continue
        if state.get("policy_version") != version:
            audit.bad_checkpoints.append(f"{version}: the file holds version {state.get('policy_version')}")
        if int(state["trainer"]["steps"]) != steps:
            audit.bad_checkpoints.append(f"{version}: the file holds trainer step {state['trainer']['steps']}, "
                                         f"{steps} was published")
    audit.trained = len(named)
    audit.duplicated = sorted(e for e, n in named.items() if n > 1)
    audit.not_done = sorted(e for e in named if states.get(e) != "done")
    if expect_all_trained:
        audit.skipped = sorted(set(states) - set(named))
    if audit.versions:
        lo, hi = audit.versions[0], audit.versions[-1]
        audit.gaps = sorted(set(range(lo, hi + 1)) - set(audit.versions))
    return audit
