"""Batches of a Sapwood run for verl's trainer, exactly once across a verl restart.

:class:`ReplayBatches` claims a run's executions through the run queue (``runs.claim``, in the run's
fixed order) as one stable holder, builds each batch (Jmax-bounded subtrees, the learner's reward policy)
and converts it to verl's ``DataProto``. verl's trainer saves the actor (and critic) checkpoint, then the
data loader's ``state_dict()``: that call is the commit point, so it marks done every execution handed out
since the previous commit (they are in the weights being checkpointed). After a crash verl loads the last
checkpoint and calls ``load_state_dict``; this gives back to the queue what the dead process claimed but
never committed (it trained weights that died with it), so those executions are trained again, once, by
the resumed lineage. An execution is therefore in exactly one checkpointed step's batch.

The store does not know verl's step numbers: ``state_dict`` returns ``{"holder", "committed_batches"}``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from sapwood.adapters.verl.rows import trajectory_rows
from sapwood.learner.assembly import build_batch
from sapwood.learner.config import SourceConfig
from sapwood.platform import runs
from sapwood.platform.store import Store

__all__ = ["ReplayBatches"]


@dataclass
class ReplayBatches:
    """An iterable of verl ``DataProto`` batches over run ``run_id`` (see the module docstring).

    ``executions_per_batch`` executions per batch (the last may hold fewer); rows per batch vary with
    the trees (at most ``source.jmax`` trajectories per execution).
    """

    store: Store
    run_id: str
    prompt_length: int
    response_length: int
    executions_per_batch: int = 4
    holder: str = ""
    """The run-queue holder; stable across restarts of one verl job (default ``verl:<run_id>``)."""
    pad_token_id: int = 0
    group_by: Literal["execution", "task"] = "execution"
    source: SourceConfig = field(default_factory=SourceConfig)
    lease_s: float = 7 * 24 * 3600.0
    """Claims are held until committed; a dead job's claims are given back by ``load_state_dict``."""
    committed_batches: int = 0
    _uncommitted: list[list[str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.executions_per_batch < 1:
            raise ValueError(f"executions_per_batch must be ≥ 1, got {self.executions_per_batch}")
        self.holder = self.holder or f"verl:{self.run_id}"

    def __iter__(self) -> Iterator[Any]:
        from sapwood.adapters.verl.data_proto import rows_to_data_proto

        while True:
            with self.store.transaction() as conn:
                ids = runs.claim(conn, self.run_id, self.holder, self.executions_per_batch, lease_s=self.lease_s)
            if not ids:
                return
            batch, used = build_batch(self.store, ids, self.source)
            self._uncommitted.append(ids)  # the unusable ones (unscored, no tree) are committed with the rest
            rows, _ = trajectory_rows(batch) if used else ([], 0)
            if not rows:
                continue
            task_ids = self._task_ids(used) if self.group_by == "task" else None
            proto, _ = rows_to_data_proto(rows, prompt_length=self.prompt_length,
                                          response_length=self.response_length, pad_token_id=self.pad_token_id,
                                          group_by=self.group_by, task_ids=task_ids)
            yield proto

    def _task_ids(self, execution_ids: list[str]) -> dict[str, str]:
        from sapwood.platform.storage.executions import execution_row

        with self.store.transaction() as conn:
            return {e: str(execution_row(conn, e)["task_id"]) for e in execution_ids}

    def state_dict(self) -> dict[str, Any]:
        """Commit what was handed out (verl saved the weights that trained on it); the state to resume."""
        pending = [e for ids in self._uncommitted for e in ids]
        if pending:
            with self.store.transaction() as conn:
                runs.complete(conn, self.run_id, self.holder, pending)
            self.committed_batches += len(self._uncommitted)
            self._uncommitted.clear()
        return {"holder": self.holder, "run_id": self.run_id, "committed_batches": self.committed_batches}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume after a restart: give back what the previous process claimed but never committed."""
        if state.get("run_id") != self.run_id:
            raise ValueError(f"state is for run {state.get('run_id')!r}, this loader reads {self.run_id!r}")
        self.holder = str(state["holder"])
        self.committed_batches = int(state["committed_batches"])
        self._uncommitted.clear()
        with self.store.transaction() as conn:
            runs.release_holder(conn, self.run_id, self.holder)
