"""The learner loop: claim a batch, train one SAO step, checkpoint, publish the policy version."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from sapwood.learner.model import PolicyBackend
from sapwood.learner.source import BatchSource, ClaimedBatch, SourceConfig
from sapwood.learner.trainer import SAOTrainer
from sapwood.platform.events import PolicyPublished
from sapwood.platform.storage.learner_reads import latest_policy as read_latest_policy
from sapwood.platform.store import Store


def latest_policy(store: Store, run_id: str) -> tuple[int, str] | None:
    """(version, checkpoint path) of the newest policy published for ``run_id``, or None."""
    with store.transaction() as conn:
        return read_latest_policy(conn, run_id)


class Learner:
    """Trains ``backend`` on the batches of ``run_id``; one :meth:`step` = one claimed batch.

    After each policy update it saves ``backend.state_dict()`` to ``checkpoint_dir`` and
    appends a ``policy_published`` event (run ``publish_run_id``, default the training run).
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
    ) -> None:
        self.store = store
        self.run_id = run_id
        self.trainer = trainer
        cfg = source_config or SourceConfig(jmax=trainer.config.jmax)
        self.source = BatchSource(store, run_id, learner_id=learner_id, config=cfg, prefetch=prefetch)
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir else None
        self.publish_run_id = publish_run_id if publish_run_id is not None else run_id
        self.history: list[dict[str, float]] = []
        self.lost_claims = 0

    @property
    def backend(self) -> PolicyBackend:
        return self.trainer.backend

    @property
    def learner_id(self) -> str:
        return self.source.learner_id

    def step(self, timeout_s: float = 0.0) -> dict[str, float] | None:
        """Train on the next batch (waiting up to ``timeout_s``); None if no batch came."""
        t_wait = time.perf_counter()
        claimed = self.source.next_batch(timeout_s)
        waited = time.perf_counter() - t_wait
        if claimed is None:
            return None
        return self.train(claimed, waited_s=waited)

    def train(self, claimed: ClaimedBatch, *, waited_s: float = 0.0) -> dict[str, float] | None:
        """One SAO step on a claimed batch; the claims are completed only after it trained."""
        if not claimed.renew():
            # another learner took (some of) these executions over after our lease expired
            self.lost_claims += 1
            claimed.release()
            return None
        t0 = time.perf_counter()
        try:
            before = self.backend.policy_version
            metrics = self.trainer.train_step(claimed.batch)
        except Exception:
            claimed.release()
            raise
        step_s = time.perf_counter() - t0
        lost = claimed.complete()
        self.lost_claims += bool(lost)
        metrics.update({
            "learner/step_s": step_s,
            "learner/wait_s": waited_s,
            "learner/assembly_s": claimed.assembly_s,
            "learner/executions": float(len(claimed.execution_ids)),
            "learner/lost_claims": float(len(lost)),
            "learner/rewards_mean": _mean_reward(claimed),
        })
        if self.backend.policy_version != before:
            self._publish()
        metrics["policy/version"] = float(self.backend.policy_version)
        self.history.append(metrics)
        return metrics

    def _publish(self) -> None:
        version = self.backend.policy_version
        checkpoint = ""
        if self.checkpoint_dir is not None:
            self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
            path = self.checkpoint_dir / f"policy-v{version:06d}.pt"
            tmp = path.with_suffix(".tmp")
            torch.save(self.backend.state_dict(), tmp)
            tmp.replace(path)
            checkpoint = str(path)
        self.store.apply([PolicyPublished(run_id=self.publish_run_id, version=version, checkpoint=checkpoint,
                                          metadata={"learner": self.learner_id,
                                                    "steps": self.trainer.steps})])

    def run(self, *, max_steps: int | None = None, idle_timeout_s: float = 5.0) -> list[dict[str, Any]]:
        """Train until ``max_steps`` or until no batch arrives for ``idle_timeout_s``."""
        done = 0
        while max_steps is None or done < max_steps:
            metrics = self.step(timeout_s=idle_timeout_s)
            if metrics is None:
                break
            done += 1
        return list(self.history)

    def close(self) -> None:
        self.source.close()


def _mean_reward(claimed: ClaimedBatch) -> float:
    r = claimed.batch.leaf_reward
    r = r[~torch.isnan(r)]
    return float(r.mean()) if r.numel() else float("nan")
