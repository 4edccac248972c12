"""The worker side of a run's prompt queue: claim a prompt sample under a lease, renew it while rolling
out, and start the sample's execution (which records the sample id).

::

    client = PromptClient(store, "run-1", lease_s=120)
    with Recorder(transport, run_id="run-1") as rec:
        while (lease := rec.claim_prompt(client)) is not None:
            with lease.keep_alive():          # renews every lease_s / 3 in the background
                ex = lease.start()            # execution metadata: prompt_sample_id, epoch, ...
                ...                           # tokenize lease.sample.prompt, record calls
                ex.finish("success", reward=r)

The sample is done when its execution's last event is stored (nothing to call). A worker that dies
holds its sample until the lease ends; then the sample is re-issued and the half-recorded execution is
marked ``abandoned`` (never trained). See :mod:`sapwood.platform.storage.prompts_sql`.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from sapwood.platform.errors import SapwoodError
from sapwood.platform.faults import fault_point
from sapwood.platform.prompts import ClaimedSample, claim_prompts
from sapwood.platform.storage.backends import prompt_queue
from sapwood.platform.store import Store

if TYPE_CHECKING:
    from sapwood.rollout.recorder import ExecutionRecorder, Recorder

__all__ = ["LostLeaseError", "PromptClient", "PromptLease"]


class LostLeaseError(SapwoodError):
    """The worker no longer holds the sample (its lease ended and the sample was re-issued)."""


class PromptClient:
    """Claims prompt samples of ``run_id`` for one worker (``worker_id``) with leases of ``lease_s``."""

    def __init__(self, store: Store, run_id: str, *, worker_id: str | None = None, lease_s: float = 300.0) -> None:
        if lease_s <= 0:
            raise ValueError(f"lease_s must be > 0, got {lease_s}")
        self.store, self.run_id, self.lease_s = store, run_id, lease_s
        self.worker_id = worker_id or f"worker-{uuid.uuid4().hex[:8]}"

    def claim(self, recorder: Recorder | None = None) -> PromptLease | None:
        """The next prompt sample, leased to this worker; None when the run has none available."""
        with self.store.transaction() as conn:
            got = claim_prompts(conn, self.run_id, self.worker_id, 1, lease_s=self.lease_s)
        if not got:
            return None
        fault_point("rollout.after_claim")
        return PromptLease(self, got[0], recorder)

    def renew(self, sample_id: str) -> bool:
        with self.store.transaction() as conn:
            return prompt_queue(conn).renew(conn, self.run_id, self.worker_id, [sample_id], lease_s=self.lease_s) == 1

    def attach(self, sample_id: str, execution_id: str) -> bool:
        with self.store.transaction() as conn:
            return prompt_queue(conn).attach(conn, self.run_id, self.worker_id, sample_id, execution_id)

    def release(self, sample_id: str) -> None:
        with self.store.transaction() as conn:
            prompt_queue(conn).release(conn, self.run_id, self.worker_id, [sample_id])

    def done(self, sample_id: str) -> bool:
        """Whether the sample is done: its current attempt's execution is finished in the store."""
        with self.store.transaction() as conn:
            return prompt_queue(conn).done(conn, self.run_id, sample_id)


class PromptLease:
    """A claimed prompt sample (:attr:`sample`) and its lease."""

    def __init__(self, client: PromptClient, sample: ClaimedSample, recorder: Recorder | None) -> None:
        self.client, self.sample, self.recorder = client, sample, recorder
        self.lost = False
        """Set when a renewal found the sample taken over."""

    def renew(self) -> bool:
        """Extend the lease; False (and :attr:`lost`) if the worker no longer holds the sample."""
        ok = self.client.renew(self.sample.sample_id)
        self.lost = self.lost or not ok
        return ok

    def start(self, recorder: Recorder | None = None, **kw: Any) -> ExecutionRecorder:
        """Start the sample's execution on ``recorder`` (task id, family, metadata from the dataset, plus
        ``prompt_sample_id``/``prompt_run_id``/``epoch``) and record it as the sample's attempt."""
        rec = recorder or self.recorder
        if rec is None:
            raise ValueError("no recorder: pass one to start() or claim through Recorder.claim_prompt")
        s = self.sample
        meta = {**s.metadata, **kw.pop("metadata", {}), "prompt_sample_id": s.sample_id, "prompt_run_id": s.run_id,
                "epoch": s.epoch, "attempt": s.attempt}
        execution_id = kw.pop("execution_id", None) or str(uuid.uuid4())
        # attach before the first event, so a crash right after leaves an attempt to abandon
        if not self.client.attach(s.sample_id, execution_id):
            self.lost = True
            raise LostLeaseError(f"sample {s.sample_id} of run {s.run_id} is no longer held by "
                                 f"{self.client.worker_id}")
        return rec.start(s.task_id, task_family=s.task_family, metadata=meta, execution_id=execution_id, **kw)

    def release(self) -> None:
        """Give the sample back now (its started execution, if any, is abandoned)."""
        self.client.release(self.sample.sample_id)

    def wait_stored(self, timeout_s: float, *, poll_s: float = 0.05) -> bool:
        """Wait until the sample is done (its execution's last event is stored); False after ``timeout_s``.

        Through Kafka the last event is stored when ingest applies it, after the recorder's flush: a worker
        keeps the lease (inside :meth:`keep_alive`) until then, so the sample is not re-issued while its
        finished execution is still on its way. (A worker killed meanwhile: the sample is re-issued after
        the lease; the first attempt may still finish in the store later and stays ``abandoned``, never
        trained.)
        """
        deadline = time.monotonic() + timeout_s
        while not self.client.done(self.sample.sample_id):
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll_s)
        return True

    @contextlib.contextmanager
    def keep_alive(self, interval_s: float | None = None) -> Iterator[PromptLease]:
        """Renew the lease every ``interval_s`` (default a third of the lease) until the block ends."""
        interval = self.client.lease_s / 3 if interval_s is None else interval_s
        stop = threading.Event()

        def loop() -> None:
            while not stop.wait(interval):
                if not self.renew():
                    return

        thread = threading.Thread(target=loop, name=f"lease-{self.sample.sample_id}", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            stop.set()
            thread.join()
