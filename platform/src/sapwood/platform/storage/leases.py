"""The lease machinery of every work queue in the store: claim, renew, complete, release.

A queue is a table with a scope column ``run_id``, a key column (``execution_id`` for the run queue,
``sample_id`` for the prompt queue) and the lease columns ``order_key state claimed_by lease_until attempts
done_at``. An item goes ``pending`` → ``claimed`` (by one holder, until ``lease_until``, unix seconds) →
``done``; a claimed item whose lease ended strictly before ``now`` is available again (at ``now ==
lease_until`` the lease still holds). :class:`LeaseQueue` is the one implementation of those moves; the
run queue (:mod:`.runs_sql`) and the prompt queue (:mod:`.prompts_sql`) both use it. Callers own the
transaction.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

#: ``lock(select, skip_locked=...)``: the select with the backend's row locks (none on SQLite;
#: ``FOR UPDATE [SKIP LOCKED]`` on PostgreSQL).
LockRows = Callable[..., sa.Select[Any]]


class LeaseQueue:
    """Lease moves over ``table`` keyed by ``(run_id, key)``; ``lock`` adds the backend's row locks."""

    def __init__(self, table: sa.Table, key: str, lock: LockRows) -> None:
        self.table, self.lock = table, lock
        self.c = table.c
        self.key = table.c[key]

    def available(self, now: float) -> Any:
        """Items a claim may take at ``now``: pending, or claimed under a lease that ended before ``now``."""
        c = self.c
        return sa.or_(c.state == "pending", sa.and_(c.state == "claimed", c.lease_until < now))

    def claim(self, conn: Connection, run_id: str, holder: str, limit: int, *, lease_s: float,
              now: float | None = None, where: Any = None) -> list[str]:
        """Claim up to ``limit`` available items until ``now + lease_s``; their keys in run order."""
        now = time.time() if now is None else now
        c = self.c
        q = sa.select(self.key).where(c.run_id == run_id, self.available(now))
        if where is not None:
            q = q.where(where)
        q = q.order_by(c.order_key).limit(limit)
        keys = [r[0] for r in conn.execute(self.lock(q, skip_locked=True))]
        if not keys:
            return []
        # The UPDATE re-checks availability, so a concurrent claimer on a backend without row locks
        # cannot take the same item: only rows still available get this holder's stamp.
        stamp = now + lease_s
        conn.execute(self.table.update()
                     .where(c.run_id == run_id, self.key.in_(keys), self.available(now))
                     .values(state="claimed", claimed_by=holder, lease_until=stamp, attempts=c.attempts + 1))
        got = {r[0] for r in conn.execute(sa.select(self.key).where(
            c.run_id == run_id, self.key.in_(keys), c.claimed_by == holder, c.lease_until == stamp))}
        return [k for k in keys if k in got]

    def renew(self, conn: Connection, run_id: str, holder: str, keys: list[str], *, lease_s: float,
              now: float | None = None) -> int:
        """Extend to ``now + lease_s`` the leases ``holder`` still holds among ``keys``; how many."""
        now = time.time() if now is None else now
        c = self.c
        result = conn.execute(self.table.update()
                              .where(c.run_id == run_id, self.key.in_(keys), c.state == "claimed",
                                     c.claimed_by == holder)
                              .values(lease_until=now + lease_s))
        return int(result.rowcount)

    def complete(self, conn: Connection, run_id: str, holder: str, keys: list[str], *,
                 now: float | None = None) -> list[str]:
        """Mark done the items ``holder`` holds; return the keys (in the given order) it no longer held."""
        c = self.c
        held_q = sa.select(self.key).where(c.run_id == run_id, self.key.in_(keys), c.state == "claimed",
                                           c.claimed_by == holder)
        held = {r[0] for r in conn.execute(self.lock(held_q, skip_locked=False))}
        if held:
            conn.execute(self.table.update().where(c.run_id == run_id, self.key.in_(sorted(held)))
                         .values(state="done", done_at=time.time() if now is None else now, lease_until=None))
        return [k for k in keys if k not in held]

    def release_holder(self, conn: Connection, run_id: str, holder: str) -> int:
        """Return every item ``holder`` still has claimed to pending (a restarted holder disowns what its
        previous process claimed but never completed); how many."""
        c = self.c
        result = conn.execute(self.table.update().where(c.run_id == run_id, c.claimed_by == holder,
                                                        c.state == "claimed")
                              .values(state="pending", claimed_by=None, lease_until=None))
        return int(result.rowcount)

    def release_predecessors(self, conn: Connection, run_id: str, identity: str, holder: str) -> int:
        """Return to pending every item claimed by an earlier process of the stable ``identity`` (holders
        ``identity#<anything>`` other than ``holder``, the caller's own); how many. Each process's holder is
        unique, so a predecessor still alive loses those items: its renew and complete no longer match."""
        c = self.c
        result = conn.execute(self.table.update().where(
            c.run_id == run_id, c.state == "claimed", c.claimed_by.startswith(f"{identity}#", autoescape=True),
            c.claimed_by != holder).values(state="pending", claimed_by=None, lease_until=None))
        return int(result.rowcount)

    def release(self, conn: Connection, run_id: str, holder: str, keys: list[str]) -> None:
        """Return ``holder``'s claimed items among ``keys`` to pending; others are left as they are."""
        c = self.c
        conn.execute(self.table.update()
                     .where(c.run_id == run_id, self.key.in_(keys), c.claimed_by == holder, c.state == "claimed")
                     .values(state="pending", claimed_by=None, lease_until=None))
