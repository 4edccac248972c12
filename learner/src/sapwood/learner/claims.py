"""Claims: a learner takes finished executions of its run, exactly once per run, and trains on them.

A :class:`BatchSource` claims executions of its run (``sapwood.platform.runs``) under a lease, hands
them to :func:`sapwood.learner.assembly.build_batch`, and completes or releases the claims after the
step (:class:`ClaimedBatch`). A crashed learner's claims are claimable again when their lease ends, or at
once when its restart has the same stable ``identity``: each process claims as ``identity#<random>`` (a
holder no other process has) and on start gives back every claim of an earlier ``identity#…`` holder. A
predecessor that is in fact still alive then finds those claims gone at its renew or its commit (the
commit's ``complete`` runs in the publishing transaction), rolls back and reloads, so no batch is
committed by two learners.
"""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from sapwood.learner.assembly import build_batch
from sapwood.learner.batch import TreeBatch
from sapwood.learner.config import SourceConfig
from sapwood.platform import runs
from sapwood.platform.store import Store

__all__ = ["BatchSource", "ClaimedBatch"]


@dataclass
class ClaimedBatch:
    """A batch and the claims behind it: ``complete()`` after training, ``release()`` on failure."""

    batch: TreeBatch
    execution_ids: list[str]
    skipped: list[str]
    assembly_s: float
    _source: BatchSource

    def renew(self) -> bool:
        """Extend the lease; False if another learner took any of these executions over."""
        return self._source.renew(self.execution_ids)

    def complete(self) -> list[str]:
        """Mark the executions done for this run; return those this learner no longer held."""
        return self._source.complete(self.execution_ids + self.skipped)

    def release(self) -> None:
        self._source.release(self.execution_ids)


class BatchSource:
    """Claims and assembles batches of ``run_id`` for learner ``learner_id``, or, with a stable ``identity``
    (e.g. the learner's slot), as ``identity#<random>`` after taking over that identity's earlier claims
    (:attr:`taken_over` counts them)."""

    def __init__(
        self,
        store: Store,
        run_id: str,
        *,
        learner_id: str | None = None,
        config: SourceConfig | None = None,
        prefetch: bool = False,
        identity: str | None = None,
    ) -> None:
        if identity is not None and learner_id is not None:
            raise ValueError("pass learner_id or identity, not both")
        self.store = store
        self.run_id = run_id
        if identity is not None:
            self.learner_id = f"{identity}#{uuid.uuid4().hex[:12]}"
        else:
            self.learner_id = learner_id or f"learner-{uuid.uuid4().hex[:8]}"
        self.config = config or SourceConfig()
        self.taken_over = 0
        """Claims of earlier processes of :attr:`identity` given back on start (claimable at once)."""
        with store.transaction() as conn:
            self.run = runs.get_run(conn, run_id)
            if identity is not None:
                self.taken_over = runs.release_predecessors(conn, run_id, identity, self.learner_id)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="batch-prefetch") if prefetch else None
        self._pending: Future[ClaimedBatch | None] | None = None
        self._lock = threading.Lock()

    # -- claims ------------------------------------------------------------------------------------
    def _claim(self) -> list[str]:
        with self.store.transaction() as conn:
            if self.run["kind"] == "live":
                runs.sync_run(conn, self.run_id)
            return runs.claim(
                conn, self.run_id, self.learner_id, self.config.executions_per_batch, lease_s=self.config.lease_s
            )

    def renew(self, execution_ids: list[str]) -> bool:
        """Extend the lease of ``execution_ids``; False if this learner no longer holds every one."""
        with self.store.transaction() as conn:
            n = runs.renew(conn, self.run_id, self.learner_id, execution_ids, lease_s=self.config.lease_s)
        return n == len(execution_ids)

    def complete(self, execution_ids: list[str]) -> list[str]:
        with self.store.transaction() as conn:
            return runs.complete(conn, self.run_id, self.learner_id, execution_ids)

    def release(self, execution_ids: list[str]) -> None:
        with self.store.transaction() as conn:
            runs.release(conn, self.run_id, self.learner_id, execution_ids)

    # -- batches -----------------------------------------------------------------------------------
    def try_batch(self) -> ClaimedBatch | None:
        """Claim and assemble one batch now, or None if the run has nothing pending."""
        ids = self._claim()
        if not ids:
            return None
        t0 = time.perf_counter()
        try:
            batch, used = build_batch(self.store, ids, self.config)
        except Exception:
            self.release(ids)
            raise
        skipped = [e for e in ids if e not in used]
        if not used:  # everything claimed was excluded by the reward policy
            self.complete(skipped)
            return self.try_batch()
        return ClaimedBatch(batch, used, skipped, time.perf_counter() - t0, self)

    def next_batch(self, timeout_s: float = 0.0) -> ClaimedBatch | None:
        """The next batch, waiting up to ``timeout_s`` for executions to finish; None if none came.

        With ``prefetch`` the following batch is assembled in the background while the caller trains.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            got = self._take_prefetched() if self._pool else self.try_batch()
            if got is not None:
                if self._pool is not None:
                    self._pending = self._pool.submit(self.try_batch)
                return got
            if time.monotonic() >= deadline:
                return None
            time.sleep(self.config.poll_s)

    def _take_prefetched(self) -> ClaimedBatch | None:
        with self._lock:
            fut, self._pending = self._pending, None
        if fut is None:
            return self.try_batch()
        return fut.result()

    def close(self) -> None:
        """Stop prefetching and give back a prefetched, untrained batch."""
        if self._pool is None:
            return
        fut, self._pending = self._pending, None
        if fut is not None:
            leftover = fut.result()
            if leftover is not None:
                leftover.release()
        self._pool.shutdown(wait=True)
