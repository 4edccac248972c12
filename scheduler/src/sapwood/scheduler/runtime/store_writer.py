"""The one actor that writes the store, and the transport that executions and cells record through.

An embedded run keeps its store in one SQLite file; many processes applying to it would fight over
its single write lock, so every event goes to :class:`StoreWriter` (one Ray actor, made one in
:mod:`.cluster`) which applies them
through the ordinary :class:`~sapwood.rollout.transports.InProcessTransport`. Ray runs the calls one
caller makes to one actor in the order they were made, so each execution's events arrive in ``seq``
order without waiting for an answer per event.

The writer also remembers the last ``seq`` it saw of every execution: when an execution's actor dies,
:meth:`StoreWriter.finish_lost` records ``execution_finished(status="error", message=reason)`` after
the last event that reached it, and drops anything of that execution that arrives later.

Reads of the record go through typed methods (:meth:`StoreWriter.executions`, :meth:`StoreWriter.call_counts`,
...) over :mod:`sapwood.platform.storage.run_record`, each after applying what is queued.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import ray
from sqlalchemy.engine import Connection

from sapwood.platform.events import Event, ExecutionFinished, ExecutionStarted
from sapwood.platform.storage import cells as cell_reads
from sapwood.platform.storage import run_record
from sapwood.platform.storage.run_record import CallCounts, ExecutionRecord
from sapwood.platform.store import Store
from sapwood.rollout.transports import InProcessTransport, Transport, TransportError

__all__ = ["RayStoreTransport", "StoreWriter", "StoreWriterSink"]


class StoreWriter:
    """Applies events to the store at ``url`` (migrating it first); one instance per store."""

    def __init__(self, url: str, *, batch_size: int = 64) -> None:
        self.url = url
        self.store = Store.open(url)
        self._rejected: list[tuple[str, str | None, str]] = []
        self._transport = InProcessTransport(self.store, batch_size=batch_size, on_delivery=self._on_delivery)
        self._last_seq: dict[str, int] = {}
        self._closed: set[str] = set()
        self.dropped_late = 0
        self.applied = 0

    def _on_delivery(self, event: Event, error: BaseException | None) -> None:
        if error is None:
            self.applied += 1
        else:
            self._rejected.append((event.event_id, event.execution_id, f"{type(error).__name__}: {error}"))

    def apply(self, events: list[Event]) -> int:
        """Queue ``events`` for the store (applied in batches, at each execution's end and on flush)."""
        taken = 0
        for ev in events:
            eid = ev.execution_id
            if eid is not None and eid in self._closed:
                self.dropped_late += 1
                continue
            if eid is not None and ev.seq is not None:
                self._last_seq[eid] = max(self._last_seq.get(eid, -1), ev.seq)
            if isinstance(ev, ExecutionFinished) and eid is not None:
                self._closed.add(eid)
            self._transport.send(ev)
            taken += 1
        return taken

    def flush(self, execution_id: str | None = None) -> list[tuple[str, str | None, str]]:
        """Apply everything queued; returns ``(event_id, execution_id, error)`` of rejected events
        (of ``execution_id`` only when given; those are then forgotten)."""
        self._transport._apply_buffer()
        if execution_id is None:
            out, self._rejected = self._rejected, []
            return out
        mine = [r for r in self._rejected if r[1] == execution_id]
        self._rejected = [r for r in self._rejected if r[1] != execution_id]
        return mine

    def finish_lost(self, execution_id: str, reason: str, *, run_id: str = "", task_id: str = "") -> bool:
        """Record that ``execution_id`` ended as ``error`` because its actor was lost.

        Returns False (and records nothing) when the execution had already finished. An execution that
        never got its ``execution_started`` here is started first (run ``run_id``, task ``task_id``)
        so the failure is on record, never silently missing.
        """
        if execution_id in self._closed:
            return False
        seq = self._last_seq.get(execution_id)
        if seq is None:
            if not run_id or not task_id:
                raise ValueError(f"execution {execution_id} has no events here: pass run_id and task_id to record it")
            self.apply([ExecutionStarted(execution_id=execution_id, seq=0, run_id=run_id, task_id=task_id,
                                         metadata={"lost_before_start": True})])
            seq = 0
        msg = reason if len(reason) <= 2000 else reason[:1997] + "..."
        self.apply([ExecutionFinished(execution_id=execution_id, seq=seq + 1, status="error", message=msg)])
        self.flush()
        return True

    def stats(self) -> dict[str, int]:
        return {"applied": self.applied, "dropped_late": self.dropped_late, "rejected_pending": len(self._rejected)}

    # -- reads of the record (everything queued is applied first) ----------------------------------
    def executions(self) -> dict[str, ExecutionRecord]:
        """Every stored execution by id: status, message, call count, metadata."""
        with self._reading() as conn:
            return run_record.execution_records(conn)

    def call_counts(self) -> dict[str, CallCounts]:
        """Stored model calls per execution id (all, actions, distinct ``seq``)."""
        with self._reading() as conn:
            return run_record.call_counts(conn)

    def switch_phases(self, cell_id: str) -> set[str]:
        """Names of the switch phases recorded for ``cell_id``."""
        with self._reading() as conn:
            return run_record.switch_phase_names(conn, cell_id)

    def cell_roles(self) -> dict[str, str]:
        """cell id → role in the ``cells`` projection."""
        with self._reading() as conn:
            return run_record.cell_roles(conn)

    def decisions(self, cell_id: str, role: str | None = None, *, limit: int = 1000) -> list[dict[str, Any]]:
        """The recorded role decisions of ``cell_id`` (to ``role`` only, when given), oldest first."""
        with self._reading() as conn:
            return cell_reads.decisions(conn, limit=limit, cell_id=cell_id, role=role)

    @contextlib.contextmanager
    def _reading(self) -> Iterator[Connection]:
        self._transport._apply_buffer()
        with self.store.transaction() as conn:
            yield conn

    def close(self) -> None:
        self._transport.close()
        self.store.close()


class RayStoreTransport(Transport):
    """Sends events to a :class:`StoreWriter` in batches of ``batch_size`` (one RPC each) without waiting;
    :meth:`flush` sends the rest, waits and reports rejects.

    ``execution_id`` (optional) limits the rejects :meth:`flush` reports to one execution's. Events
    still batched here when the process dies are lost with it (the writer's ``finish_lost`` then closes
    the execution after the last event that reached it).
    """

    def __init__(self, writer: Any, *, execution_id: str | None = None, batch_size: int = 1) -> None:
        super().__init__()
        if batch_size < 1:
            raise ValueError(f"batch_size must be ≥ 1, got {batch_size}")
        self.writer = writer
        self.execution_id = execution_id
        self.batch_size = batch_size
        self._batch: list[Event] = []
        self._pending: list[Any] = []
        self._lock = threading.Lock()
        self.rpcs = 0

    def _send_batch(self) -> None:
        batch, self._batch = self._batch, []
        if batch:
            self._pending.append(self.writer.apply.remote(batch))
            self.rpcs += 1

    def send(self, event: Event) -> None:
        with self._lock:
            self._batch.append(event)
            if len(self._batch) >= self.batch_size:
                self._send_batch()
            if len(self._pending) > 256:
                ray.get(self._pending)
                self._pending.clear()

    def flush(self, timeout: float | None = None) -> None:
        with self._lock:
            self._send_batch()
            pending, self._pending = self._pending, []
        ray.get(pending, timeout=timeout)
        rejected = ray.get(self.writer.flush.remote(self.execution_id), timeout=timeout)
        if rejected:
            shown = "; ".join(f"{eid} ({ex}): {err}" for eid, ex, err in rejected[:5])
            raise TransportError(f"the store rejected {len(rejected)} event(s): {shown}")

    def close(self, timeout: float | None = None) -> None:
        self.flush(timeout)


class StoreWriterSink:
    """An event sink (:class:`~sapwood.scheduler.decisions.EventSink`) onto a :class:`StoreWriter` actor:
    ``send`` queues here, ``flush`` hands the queue to the writer and waits until it took it."""

    def __init__(self, writer: Any) -> None:
        self.writer = writer
        self._queued: list[Event] = []

    def send(self, event: Event) -> None:
        self._queued.append(event)

    def flush(self, timeout: float | None = None) -> None:
        queued, self._queued = self._queued, []
        if queued:
            ray.get(self.writer.apply.remote(queued), timeout=timeout)
