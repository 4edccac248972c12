"""The learner loop: claim a batch, train one SAO step, then commit the step exactly once.

A step that moves the policy is committed in two moves (:meth:`Learner.train`):

1. the checkpoint (:mod:`sapwood.learner.checkpoint`: weights, both optimizers, trainer counters,
   RNG states) is written under a temporary name and renamed to a name holding its version and
   content digest;
2. ONE store transaction marks the step's claims ``done`` and applies the ``policy_published`` event
   (version, checkpoint path, digest, trainer step, the trained execution ids). If this learner no
   longer holds every claim, or the version was published by another learner, the transaction rolls
   back and the learner reloads the newest published checkpoint.

A kill anywhere before the commit leaves the claims ``claimed`` (re-issued after their lease) and the
newest published checkpoint unchanged, so the restart (:meth:`Learner.resume`) retrains those
executions from the state before them: nothing is lost and nothing is trained twice into a published
version. A checkpoint written but never published is ignored and removed after a grace period.
Steps that do not move the policy (critic warm-up, empty batches) keep their claims held and are
committed with the next version.
"""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

import torch

from sapwood.learner.checkpoint import (
    CheckpointError,
    read_checkpoint,
    remove_unpublished,
    restore_training_state,
    training_state,
    write_checkpoint,
)
from sapwood.learner.claims import BatchSource, ClaimedBatch
from sapwood.learner.config import SourceConfig
from sapwood.learner.model import PolicyBackend
from sapwood.learner.trainer import SAOTrainer
from sapwood.platform import runs
from sapwood.platform.apply import apply_events
from sapwood.platform.errors import ConflictError
from sapwood.platform.events import PolicyPublished
from sapwood.platform.faults import fault_point
from sapwood.platform.storage.learner_reads import latest_policy as read_latest_policy
from sapwood.platform.storage.learner_reads import latest_policy_record, published_checkpoints
from sapwood.platform.store import Store


def latest_policy(store: Store, run_id: str) -> tuple[int, str] | None:
    """(version, checkpoint path) of the newest policy published for ``run_id``, or None."""
    with store.transaction() as conn:
        return read_latest_policy(conn, run_id)


class _LostClaims(Exception):
    """Raised inside the commit transaction to roll it back: another learner holds some claims now."""


class Learner:
    """Trains ``backend`` on the batches of ``run_id``; one :meth:`step` = one claimed batch.

    Each policy update is committed atomically (module docstring): checkpoint under ``checkpoint_dir``,
    then the claims ``done`` and a ``policy_published`` event of run ``publish_run_id`` (default the
    training run) in one transaction. Call :meth:`resume` before the first step to continue a run.
    """

    def __init__(
        self,
        store: Store,
        run_id: str,
        trainer: SAOTrainer,
        *,
        source_config: SourceConfig | None = None,
        learner_id: str | None = None,
        checkpoint_dir: str | Path | None = None,
        publish_run_id: str | None = None,
        prefetch: bool = False,
        checkpoint_grace_s: float = 3600.0,
        identity: str | None = None,
    ) -> None:
        self.store = store
        self.run_id = run_id
        self.trainer = trainer
        cfg = source_config or SourceConfig(jmax=trainer.config.jmax)
        self.source = BatchSource(store, run_id, learner_id=learner_id, config=cfg, prefetch=prefetch,
                                  identity=identity)
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir else None
        self.publish_run_id = publish_run_id if publish_run_id is not None else run_id
        self.checkpoint_grace_s = checkpoint_grace_s
        """Unpublished checkpoints older than this (seconds) are removed by :meth:`resume`."""
        self.history: list[dict[str, float]] = []
        self.lost_claims = 0
        self.rollbacks = 0
        """Commits rolled back (claims lost or version taken) and answered by reloading the published state."""
        self._held: list[ClaimedBatch] = []
        """Trained batches not committed yet (steps that did not move the policy)."""
        self._start_state: dict[str, Any] | None = None
        """The state :meth:`resume` started from when the run had no version yet (dropped at the first commit)."""

    @property
    def backend(self) -> PolicyBackend:
        return self.trainer.backend

    @property
    def learner_id(self) -> str:
        return self.source.learner_id

    # -- resume ------------------------------------------------------------------------------------
    def resume(self) -> int | None:
        """Load the newest published checkpoint of ``publish_run_id`` (digest checked) into the trainer.

        Returns the version loaded, or None when there is nothing of this learner's format to load (no
        version yet, or a version published without a digest, e.g. initial weights, at the backend's own
        version). Also removes this directory's unpublished checkpoints older than the grace period.
        Raises :class:`CheckpointError` if the newest version's file is missing or does not match.
        """
        version = self._load_published(strict=False)
        if version is None:  # nothing published yet: a rollback before the first version returns here
            self._start_state = copy.deepcopy(training_state(self.trainer))
        return version

    def _load_published(self, *, strict: bool) -> int | None:
        """:meth:`resume`; ``strict``: the newest version must be a checkpoint of this learner's format."""
        with self.store.transaction() as conn:
            record = latest_policy_record(conn, self.publish_run_id)
            keep = published_checkpoints(conn)
        if self.checkpoint_dir is not None:
            remove_unpublished(self.checkpoint_dir, keep, grace_s=self.checkpoint_grace_s)
        if record is None:
            if strict and self._start_state is not None:
                restore_training_state(self.trainer, self._start_state)
                return None
            if strict:
                raise CheckpointError(f"run {self.publish_run_id!r} has no published checkpoint to return to")
            return None
        version, path, metadata = record
        digest = metadata.get("digest")
        if not digest:
            if version == self.backend.policy_version and not strict:
                return None
            raise CheckpointError(f"newest policy version {version} of run {self.publish_run_id!r} was published "
                                  f"without a digest ({path!r}); this learner cannot continue from it")
        restore_training_state(self.trainer, read_checkpoint(path, str(digest)))
        return version

    # -- steps -------------------------------------------------------------------------------------
    def step(self, timeout_s: float = 0.0) -> dict[str, float] | None:
        """Train on the next batch (waiting up to ``timeout_s``); None if no batch came."""
        t_wait = time.perf_counter()
        claimed = self.source.next_batch(timeout_s)
        waited = time.perf_counter() - t_wait
        if claimed is None:
            return None
        return self.train(claimed, waited_s=waited)

    def train(self, claimed: ClaimedBatch, *, waited_s: float = 0.0) -> dict[str, float] | None:
        """One SAO step on a claimed batch; a policy update is committed with its claims (module docstring).

        Returns None (and counts a lost claim) when this learner lost a claim before or at the commit.
        """
        if not all(c.renew() for c in [*self._held, claimed]):
            # another learner took (some of) these executions over after our lease expired
            self.lost_claims += 1
            self._roll_back([*self._held, claimed], trained=bool(self._held))
            return None
        t0 = time.perf_counter()
        try:
            before = self.backend.policy_version
            metrics = self.trainer.train_step(claimed.batch)
        except Exception:
            claimed.release()
            raise
        step_s = time.perf_counter() - t0
        fault_point("learner.after_step")
        self._held.append(claimed)
        committed = True
        if self.backend.policy_version != before:
            committed = self._commit()
        metrics.update({
            "learner/step_s": step_s,
            "learner/wait_s": waited_s,
            "learner/assembly_s": claimed.assembly_s,
            "learner/executions": float(len(claimed.execution_ids)),
            "learner/lost_claims": float(not committed),
            "learner/rewards_mean": _mean_reward(claimed),
        })
        if not committed:
            return None
        metrics["policy/version"] = float(self.backend.policy_version)
        self.history.append(metrics)
        return metrics

    def _commit(self) -> bool:
        """Checkpoint, then claims ``done`` + ``policy_published`` in one transaction; False if rolled back."""
        version = self.backend.policy_version
        checkpoint, digest = "", ""
        if self.checkpoint_dir is not None:
            written = write_checkpoint(self.checkpoint_dir, version, training_state(self.trainer))
            checkpoint, digest = str(written.path), written.digest
        fault_point("learner.after_checkpoint")
        trained = [e for c in self._held for e in c.execution_ids]
        excluded = [e for c in self._held for e in c.skipped]
        event = PolicyPublished(run_id=self.publish_run_id, version=version, checkpoint=checkpoint, metadata={
            "learner": self.learner_id, "steps": self.trainer.steps, "batches": len(self._held), "digest": digest,
            "train_run": self.run_id,
            "execution_ids": trained, "excluded_execution_ids": excluded})
        try:
            with self.store.transaction() as conn:
                lost = runs.complete(conn, self.run_id, self.learner_id, trained + excluded)
                if lost:
                    raise _LostClaims(lost)
                fault_point("learner.in_commit")
                result = apply_events(conn, [event], cache=self.store.cache)
        except (_LostClaims, ConflictError):
            self.lost_claims += 1
            self._roll_back(self._held)
            return False
        self.store.cache.merge(result.new_states)
        self._held = []
        self._start_state = None
        return True

    def _roll_back(self, batches: list[ClaimedBatch], *, trained: bool = True) -> None:
        """Give back ``batches``' claims; when the in-memory state ``trained`` on them, reload the newest
        published state (it trained on executions this learner may no longer own)."""
        for c in batches:
            c.release()
        self._held = []
        self.rollbacks += 1
        if trained:
            self._load_published(strict=True)

    def run(self, *, max_steps: int | None = None, idle_timeout_s: float = 5.0) -> list[dict[str, Any]]:
        """Train until ``max_steps`` committed steps or until no batch arrives for ``idle_timeout_s``."""
        done = 0
        while max_steps is None or done < max_steps:
            lost = self.lost_claims
            metrics = self.step(timeout_s=idle_timeout_s)
            if metrics is None and self.lost_claims == lost:
                break
            done += metrics is not None
        return list(self.history)

    def close(self) -> None:
        """Stop prefetching; give back the claims of uncommitted steps (they are retrained from the
        newest published checkpoint by whoever claims them next)."""
        for c in self._held:
            c.release()
        self._held = []
        self.source.close()


def _mean_reward(claimed: ClaimedBatch) -> float:
    r = claimed.batch.leaf_reward
    r = r[~torch.isnan(r)]
    return float(r.mean()) if r.numel() else float("nan")
