"""The prompt queue of a run: which prompt samples rollout workers owe the run, each rolled out once.

``prompts`` holds a run's dataset rows; ``prompt_samples`` one row per (prompt, epoch, sample), leased to
rollout workers with the run queue's machinery (:class:`~sapwood.platform.storage.leases.LeaseQueue`):
``pending`` → ``claimed`` → ``done``. ``prompt_attempts`` records each execution started for a sample.

* A sample is **done** when the execution of its current attempt is finished in the store (its last
  event stored): :meth:`PromptQueue.sync` marks it, and every claim and progress read syncs first.
* A claimed sample whose lease ran out without a finished execution is **re-issued**: the next claim
  takes it, and its half-recorded execution's attempt becomes ``abandoned`` (kept for audit; the run
  queue never queues an abandoned execution, so it is never trained).

Portable SQL; the row locks come from the dialect's run queue. Callers own the transaction.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from sapwood.platform import schema as t
from sapwood.platform.events.base import FINISH_STATUSES
from sapwood.platform.storage.leases import LeaseQueue
from sapwood.platform.storage.runs_sql import SqlRunQueue, replay_order_key

__all__ = ["ClaimedSample", "PromptQueue", "PromptRow"]

_ps = t.prompt_samples.c
_pa = t.prompt_attempts.c
_p = t.prompts.c
_e = t.executions.c
#: Order keys: epoch in the high bits, so every sample of epoch e is claimed before any of e + 1.
_EPOCH_SHIFT = 40


@dataclass(frozen=True)
class PromptRow:
    """One dataset row: the prompt (text or chat messages) and what the execution is recorded under."""

    prompt: Any
    task_id: str
    task_family: str
    metadata: dict[str, Any]


@dataclass(frozen=True)
class ClaimedSample:
    """A prompt sample leased to a worker until ``lease_until`` (unix seconds)."""

    run_id: str
    sample_id: str
    prompt_index: int
    epoch: int
    sample: int
    attempt: int
    lease_until: float
    prompt: Any
    task_id: str
    task_family: str
    metadata: dict[str, Any]


def sample_id(prompt_index: int, epoch: int, sample: int) -> str:
    return f"{prompt_index}:{epoch}:{sample}"


class PromptQueue:
    """Prompt samples of runs on one backend (module docstring); ``lock`` adds the backend's row locks."""

    def __init__(self, runs: SqlRunQueue) -> None:
        self.leases = LeaseQueue(t.prompt_samples, "sample_id", runs.lock_candidates)

    def add(self, conn: Connection, run_id: str, rows: list[PromptRow], *, samples_per_prompt: int, epochs: int,
            seed: int = 0) -> int:
        """Append ``rows`` to the run's prompts with their samples; return how many samples were queued."""
        first = conn.execute(sa.select(sa.func.max(_p.prompt_index)).where(_p.run_id == run_id)).scalar()
        start = 0 if first is None else int(first) + 1
        if not rows:
            return 0
        conn.execute(t.prompts.insert(), [
            {"run_id": run_id, "prompt_index": start + i, "prompt": r.prompt, "task_id": r.task_id,
             "task_family": r.task_family, "metadata": r.metadata} for i, r in enumerate(rows)])
        samples = []
        for i in range(start, start + len(rows)):
            for epoch in range(epochs):
                for s in range(samples_per_prompt):
                    sid = sample_id(i, epoch, s)
                    key = (epoch << _EPOCH_SHIFT) | (replay_order_key(seed + epoch, sid) >> (63 - _EPOCH_SHIFT))
                    samples.append({"run_id": run_id, "sample_id": sid, "prompt_index": i, "epoch": epoch,
                                    "order_key": key, "state": "pending", "claimed_by": None, "lease_until": None,
                                    "attempts": 0, "done_at": None, "execution_id": None})
        conn.execute(t.prompt_samples.insert(), samples)
        return len(samples)

    def prompts(self, conn: Connection, run_id: str) -> list[PromptRow]:
        """The run's queued prompts (one per dataset row, not per sample), in dataset order."""
        rows = conn.execute(sa.select(_p.prompt, _p.task_id, _p.task_family, _p.metadata)
                            .where(_p.run_id == run_id).order_by(_p.prompt_index))
        return [PromptRow(prompt=r.prompt, task_id=r.task_id, task_family=r.task_family, metadata=dict(r.metadata))
                for r in rows]

    def sync(self, conn: Connection, run_id: str, *, now: float | None = None) -> int:
        """Mark done the claimed samples whose current execution finished; return how many."""
        now = time.time() if now is None else now
        finished = sa.select(_e.execution_id).where(_e.status.in_(FINISH_STATUSES))
        ids = [r[0] for r in conn.execute(sa.select(_ps.sample_id).where(
            _ps.run_id == run_id, _ps.state == "claimed", _ps.execution_id.in_(finished)))]
        if not ids:
            return 0
        conn.execute(t.prompt_samples.update().where(_ps.run_id == run_id, _ps.sample_id.in_(ids))
                     .values(state="done", done_at=now, lease_until=None))
        conn.execute(t.prompt_attempts.update().where(
            _pa.run_id == run_id, _pa.sample_id.in_(ids), _pa.state == "recording",
            _pa.execution_id.in_(finished)).values(state="finished"))
        return len(ids)

    def done(self, conn: Connection, run_id: str, sample_id: str) -> bool:
        """Whether ``sample_id`` is done (after a :meth:`sync`, so a just-stored finish counts)."""
        self.sync(conn, run_id)
        state = conn.execute(sa.select(_ps.state).where(_ps.run_id == run_id, _ps.sample_id == sample_id)).scalar()
        return state == "done"

    def claim(self, conn: Connection, run_id: str, worker: str, limit: int = 1, *, lease_s: float,
              now: float | None = None) -> list[ClaimedSample]:
        """Claim up to ``limit`` samples (pending, or re-issued after a lease ran out) until ``now + lease_s``."""
        now = time.time() if now is None else now
        self.sync(conn, run_id, now=now)
        got = self.leases.claim(conn, run_id, worker, limit, lease_s=lease_s, now=now)
        if not got:
            return []
        # a re-issued sample's previous attempt never finished: abandoned (kept, never trained)
        self._abandon(conn, run_id, got)
        conn.execute(t.prompt_samples.update().where(_ps.run_id == run_id, _ps.sample_id.in_(got))
                     .values(execution_id=None))
        rows = conn.execute(sa.select(_ps.sample_id, _ps.prompt_index, _ps.epoch, _ps.attempts, _ps.lease_until,
                                      _p.prompt, _p.task_id, _p.task_family, _p.metadata)
                            .join(t.prompts, sa.and_(_p.run_id == _ps.run_id, _p.prompt_index == _ps.prompt_index))
                            .where(_ps.run_id == run_id, _ps.sample_id.in_(got))).all()
        by_id = {r.sample_id: r for r in rows}
        return [ClaimedSample(run_id, sid, int(r.prompt_index), int(r.epoch), int(sid.rsplit(":", 1)[1]),
                              int(r.attempts), float(r.lease_until), r.prompt, str(r.task_id), str(r.task_family),
                              dict(r.metadata or {})) for sid in got for r in [by_id[sid]]]

    def _abandon(self, conn: Connection, run_id: str, sample_ids: list[str]) -> None:
        conn.execute(t.prompt_attempts.update().where(
            _pa.run_id == run_id, _pa.sample_id.in_(sample_ids), _pa.state == "recording").values(state="abandoned"))

    def attach(self, conn: Connection, run_id: str, worker: str, sample: str, execution_id: str, *,
               now: float | None = None) -> bool:
        """Record ``execution_id`` as ``sample``'s current attempt; False if ``worker`` no longer holds it."""
        now = time.time() if now is None else now
        result = conn.execute(t.prompt_samples.update().where(
            _ps.run_id == run_id, _ps.sample_id == sample, _ps.state == "claimed", _ps.claimed_by == worker,
            _ps.execution_id.is_(None)).values(execution_id=execution_id))
        if result.rowcount != 1:
            return False
        conn.execute(t.prompt_attempts.insert().values(execution_id=execution_id, run_id=run_id, sample_id=sample,
                                                       worker=worker, started_at=now, state="recording"))
        return True

    def renew(self, conn: Connection, run_id: str, worker: str, sample_ids: list[str], *, lease_s: float,
              now: float | None = None) -> int:
        return self.leases.renew(conn, run_id, worker, sample_ids, lease_s=lease_s, now=now)

    def release(self, conn: Connection, run_id: str, worker: str, sample_ids: list[str]) -> None:
        """Give samples back; an execution already started for one is abandoned."""
        held = [r[0] for r in conn.execute(sa.select(_ps.sample_id).where(
            _ps.run_id == run_id, _ps.sample_id.in_(sample_ids), _ps.state == "claimed", _ps.claimed_by == worker))]
        if not held:
            return
        self._abandon(conn, run_id, held)
        conn.execute(t.prompt_samples.update().where(_ps.run_id == run_id, _ps.sample_id.in_(held))
                     .values(execution_id=None))
        self.leases.release(conn, run_id, worker, held)

    def progress(self, conn: Connection, run_id: str, *, now: float | None = None) -> dict[int, dict[str, int]]:
        """Per epoch: samples ``pending`` / ``claimed`` / ``done`` and executions ``abandoned``."""
        self.sync(conn, run_id, now=now)
        out: dict[int, dict[str, int]] = {}
        for epoch, state, n in conn.execute(sa.select(_ps.epoch, _ps.state, sa.func.count())
                                            .where(_ps.run_id == run_id).group_by(_ps.epoch, _ps.state)):
            out.setdefault(int(epoch), {"pending": 0, "claimed": 0, "done": 0, "abandoned": 0})[str(state)] = int(n)
        abandoned = conn.execute(sa.select(_ps.epoch, sa.func.count())
                                 .join(t.prompt_attempts, sa.and_(_pa.run_id == _ps.run_id,
                                                                  _pa.sample_id == _ps.sample_id))
                                 .where(_ps.run_id == run_id, _pa.state == "abandoned").group_by(_ps.epoch))
        for epoch, n in abandoned:
            out[int(epoch)]["abandoned"] = int(n)
        return dict(sorted(out.items()))

    def runs(self, conn: Connection) -> list[str]:
        """Ids of the runs that have prompt samples."""
        return [str(r[0]) for r in conn.execute(sa.select(_ps.run_id).distinct().order_by(_ps.run_id))]

    def attempts(self, conn: Connection, run_id: str) -> list[dict[str, Any]]:
        """Every attempt of the run (``execution_id sample_id worker started_at state``), for audits."""
        rows = conn.execute(sa.select(_pa.execution_id, _pa.sample_id, _pa.worker, _pa.started_at, _pa.state)
                            .where(_pa.run_id == run_id).order_by(_pa.started_at))
        return [dict(r._mapping) for r in rows]
