"""The run queue's SQL shared by both backends; the dialect modules add row locks and the upsert.

:class:`SqlRunQueue` implements :class:`~sapwood.platform.storage.runs.RunQueue` over ``runs`` and
``run_items``; a subclass supplies :meth:`~SqlRunQueue.lock_candidates` (how the claim's and the
completion's reads lock rows) and :meth:`~SqlRunQueue.insert_new_items` (insert, skipping items
already queued).
"""

from __future__ import annotations

import functools
import hashlib
import time
from abc import abstractmethod
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from sapwood.platform import schema as t
from sapwood.platform.errors import ConflictError
from sapwood.platform.events.base import FINISH_STATUSES
from sapwood.platform.storage.leases import LeaseQueue
from sapwood.platform.storage.runs import RunKind, RunQueue

if TYPE_CHECKING:
    from sapwood.platform.execution_filter import ExecutionFilter

_ri = t.run_items.c
_e = t.executions.c


def execution_condition(flt: ExecutionFilter) -> Any:
    """SQL condition on the ``executions`` table selecting what ``flt`` selects (bound parameters only)."""
    conds: list[Any] = []
    if flt.run_id is not None:
        conds.append(_e.run_id == flt.run_id)
    if flt.task_id is not None:
        conds.append(_e.task_id == flt.task_id)
    if flt.task_family is not None:
        conds.append(_e.task_family == flt.task_family)
    if flt.status:
        conds.append(_e.status.in_(flt.status))
    if flt.min_policy_version is not None:
        conds.append(_e.max_policy_version >= flt.min_policy_version)
    if flt.max_policy_version is not None:
        conds.append(_e.max_policy_version <= flt.max_policy_version)
    score = sa.func.coalesce(_e.reward, _e.score)
    if flt.min_score is not None:
        conds.append(score >= flt.min_score)
    if flt.max_score is not None:
        conds.append(score <= flt.max_score)
    if flt.started_after is not None:
        conds.append(_e.started_at >= flt.started_after)
    if flt.started_before is not None:
        conds.append(_e.started_at < flt.started_before)
    return sa.and_(sa.true(), *conds)


def replay_order_key(seed: int, execution_id: str) -> int:
    """Position of ``execution_id`` in a replay run of ``seed``: 63 bits of BLAKE2b (fits a signed BIGINT)."""
    digest = hashlib.blake2b(f"{seed}:{execution_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


class SqlRunQueue(RunQueue):
    """The run queue in portable SQL; see :mod:`sapwood.platform.storage.runs` for the contract."""

    @abstractmethod
    def lock_candidates(self, q: sa.Select[Any], *, skip_locked: bool) -> sa.Select[Any]:
        """``q`` with the backend's row locks (``skip_locked``: skip rows another transaction locked)."""

    @abstractmethod
    def insert_new_items(self, conn: Connection, rows: list[dict[str, Any]]) -> None:
        """Insert ``rows`` into ``run_items``, skipping any (run, execution) already there."""

    # -- runs ------------------------------------------------------------------------------------------
    def create(self, conn: Connection, run_id: str, *, kind: RunKind, filter_json: dict[str, Any], seed: int,
               config: dict[str, Any], description: str, created_at: float) -> None:
        if conn.execute(sa.select(t.runs.c.run_id).where(t.runs.c.run_id == run_id)).first():
            raise ConflictError(f"run {run_id!r} already exists")
        conn.execute(t.runs.insert().values(run_id=run_id, kind=kind, filter=filter_json, seed=seed, config=config,
                                            description=description, created_at=created_at))

    def get(self, conn: Connection, run_id: str) -> dict[str, Any] | None:
        row = conn.execute(sa.select(t.runs).where(t.runs.c.run_id == run_id)).mappings().first()
        return None if row is None else dict(row)

    def snapshot(self, conn: Connection, run_id: str, flt: ExecutionFilter, *, kind: RunKind, seed: int,
                 now: float | None = None) -> int:
        abandoned = sa.select(t.prompt_attempts.c.execution_id).where(t.prompt_attempts.c.state == "abandoned")
        q = sa.select(_e.execution_id).where(execution_condition(flt), _e.status.in_(FINISH_STATUSES),
                                             _e.execution_id.not_in(abandoned))  # never trained
        q = q.order_by(_e.execution_id) if kind == "replay" else q.order_by(_e.finished_at, _e.execution_id)
        queued = {r[0] for r in conn.execute(sa.select(_ri.execution_id).where(_ri.run_id == run_id))}
        now_key = int((time.time() if now is None else now) * 1e6)
        rows = []
        for i, (eid,) in enumerate(conn.execute(q)):
            if eid in queued:
                continue
            key = replay_order_key(seed, eid) if kind == "replay" else now_key + i
            rows.append({"run_id": run_id, "execution_id": eid, "order_key": key, "state": "pending",
                         "claimed_by": None, "lease_until": None, "attempts": 0, "done_at": None})
        if rows:
            self.insert_new_items(conn, rows)
        return len(rows)

    # -- items: the shared lease machinery (:mod:`.leases`) over run_items -----------------------------
    @functools.cached_property
    def leases(self) -> LeaseQueue:
        return LeaseQueue(t.run_items, "execution_id", self.lock_candidates)

    def claim(self, conn: Connection, run_id: str, learner_id: str, limit: int, *, lease_s: float,
              now: float | None = None) -> list[str]:
        return self.leases.claim(conn, run_id, learner_id, limit, lease_s=lease_s, now=now)

    def renew(self, conn: Connection, run_id: str, learner_id: str, execution_ids: list[str], *, lease_s: float,
              now: float | None = None) -> int:
        return self.leases.renew(conn, run_id, learner_id, execution_ids, lease_s=lease_s, now=now)

    def complete(self, conn: Connection, run_id: str, learner_id: str, execution_ids: list[str], *,
                 now: float | None = None) -> list[str]:
        return self.leases.complete(conn, run_id, learner_id, execution_ids, now=now)

    def release(self, conn: Connection, run_id: str, learner_id: str, execution_ids: list[str]) -> None:
        self.leases.release(conn, run_id, learner_id, execution_ids)

    def release_holder(self, conn: Connection, run_id: str, learner_id: str) -> int:
        return self.leases.release_holder(conn, run_id, learner_id)

    def release_predecessors(self, conn: Connection, run_id: str, identity: str, learner_id: str) -> int:
        return self.leases.release_predecessors(conn, run_id, identity, learner_id)

    def progress(self, conn: Connection, run_id: str) -> dict[str, int]:
        rows = conn.execute(sa.select(_ri.state, sa.func.count()).where(_ri.run_id == run_id).group_by(_ri.state))
        out = {"pending": 0, "claimed": 0, "done": 0}
        out.update({s: int(n) for s, n in rows})
        return out
