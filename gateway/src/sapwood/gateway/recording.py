"""The gateway's background recorder: events go to a bounded queue and a thread hands them on in batches.

:class:`BackgroundRecorder` is a :class:`~sapwood.rollout.transports.Transport` that only enqueues;
one thread drains up to ``batch_size`` events at a time into the real transport and flushes it
(embedded SQLite: one transaction per batch; Kafka: the batch is acknowledged with ``acks=all``).
Each event's fate is known from the real transport's delivery callback, so

* ``--ack=async``: the request answers once its events are queued (the crash risk window is the
  time from enqueue to delivery, observed in ``sapwood_gateway_ack_lag_seconds``);
* ``--ack=durable``: the request waits on :meth:`take_ack` of its call's event.

Back-pressure: :meth:`admit` says whether a new call may be recorded: not while the real transport
is failing (its last send raised, or its flush raised or did not finish within ``flush_timeout_s``:
a broker that is down) and not while queued + in-flight work reaches ``max_pending``. Events that
were queued are never dropped: a failing batch is retried every ``retry_s`` seconds; an event the
transport gave up on after accepting it (Kafka's delivery timeout) is queued again and sent again
(ingest stores an event id once, so a resend that had in fact arrived is a counted duplicate);
only an event the store rejects as invalid is given up (logged and failed). :meth:`close` drains
the queue before it returns.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from sapwood.platform.errors import ValidationError
from sapwood.platform.events import Event, ExecutionFinished, ModelCall, PartialScore
from sapwood.rollout.transports import DeliveryError, Transport, TransportError

log = logging.getLogger(__name__)

ACK_MODES = ("async", "durable")


@dataclass(frozen=True)
class Admission:
    """Whether a call may be recorded now; ``reason`` names why not (``transport_unavailable`` / ``backlog``)."""

    ok: bool
    reason: str = ""


class BackgroundRecorder(Transport):
    """A bounded queue in front of ``inner``, drained by one thread in batches of ``batch_size`` events.

    ``track_acks``: keep a future per model-call, partial-score and execution-finished event (``--ack=durable``;
    see :meth:`take_ack`; each must be taken).
    ``max_pending``: events queued or handed to ``inner`` but not yet delivered, plus calls admitted
    and not yet queued, above which :meth:`admit` refuses. ``inner``'s ``on_delivery`` is chained.
    """

    def __init__(self, inner: Transport, *, batch_size: int = 256, max_pending: int = 10_000,
                 retry_s: float = 0.5, flush_timeout_s: float = 5.0, track_acks: bool = False) -> None:
        super().__init__()
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1 event, got {batch_size}")
        if max_pending < 1:
            raise ValueError(f"max_pending must be >= 1 event, got {max_pending}")
        self.inner = inner
        self.max_event_bytes = inner.max_event_bytes
        self.batch_size = batch_size
        self.max_pending = max_pending
        self.retry_s = retry_s
        self.flush_timeout_s = flush_timeout_s
        self.track_acks = track_acks
        self._queue: deque[Event] = deque()
        self._redeliver: deque[Event] = deque()  # given up by the transport after it accepted them
        self._cond = threading.Condition()
        self._undelivered = 0  # queued or in inner, fate unknown
        self._admitted = 0  # calls admitted whose events are not queued yet
        self._waiters: dict[str, concurrent.futures.Future[None]] = {}
        self._taken: set[str] = set()
        self._enqueued_at: dict[str, float] = {}
        self.failing: BaseException | None = None
        self.lags: deque[float] = deque(maxlen=100_000)  # enqueue -> delivery seconds, for the risk window
        self.delivered = 0
        #: Called with each delivered event's enqueue -> delivery seconds (a metric), on the delivery thread.
        self.lag_observer: Callable[[float], None] | None = None
        self.failed = 0
        #: Events the transport gave up on after accepting them, queued again (each time counted).
        self.redelivered = 0
        self._closing = False
        self._user_callback = inner.on_delivery
        inner.on_delivery = self._on_inner_delivery
        self._thread = threading.Thread(target=self._run, name="sapwood-gateway-recorder", daemon=True)
        self._thread.start()

    # -- producer side ------------------------------------------------------------------------------
    def admit(self) -> Admission:
        """Reserve room for one call's events, or say why not (call :meth:`release` after queueing)."""
        with self._cond:
            if self.failing is not None:
                return Admission(False, "transport_unavailable")
            if self._undelivered + self._admitted >= self.max_pending:
                return Admission(False, "backlog")
            self._admitted += 1
            return Admission(True)

    def release(self) -> None:
        """The admitted call's events are queued (or it recorded nothing)."""
        with self._cond:
            self._admitted = max(0, self._admitted - 1)

    def take_ack(self, event_id: str) -> concurrent.futures.Future[None]:
        """The future of a tracked event (``track_acks``): its result is set when the event is delivered,
        its exception when delivery failed. Each future is taken once."""
        with self._cond:
            fut = self._waiters[event_id]
            if fut.done():
                del self._waiters[event_id]
            else:
                self._taken.add(event_id)  # dropped from the table on delivery
            return fut

    def send(self, event: Event) -> None:
        if self._closing:
            raise TransportError("the gateway's recorder is closed")
        with self._cond:
            self._queue.append(event)
            if self.track_acks and isinstance(event, ModelCall | ExecutionFinished | PartialScore):
                self._waiters[event.event_id] = concurrent.futures.Future()
            self._enqueued_at[event.event_id] = time.monotonic()
            self._undelivered += 1
            self._cond.notify_all()

    @property
    def backlog(self) -> int:
        """Events queued or handed on whose delivery is not known yet."""
        return self._undelivered

    # -- delivery -------------------------------------------------------------------------------------
    def _on_inner_delivery(self, event: Event, error: BaseException | None) -> None:
        now = time.monotonic()
        if error is not None and not isinstance(error, ValidationError):
            with self._cond:  # not stored, not invalid: send it again (first in line), the transport is failing
                self._redeliver.append(event)
                self.redelivered += 1
                self.failing = error
                self._cond.notify_all()
            log.warning("gateway event %s %s: the transport gave up on it (%s); sending it again",
                        event.kind, event.event_id, error)
            return
        with self._cond:
            self._undelivered -= 1
            t0 = self._enqueued_at.pop(event.event_id, None)
            if t0 is not None:
                self.lags.append(now - t0)
                if self.lag_observer is not None:
                    self.lag_observer(now - t0)
            if error is None:
                self.delivered += 1
            else:
                self.failed += 1
            fut = self._waiters.get(event.event_id)
            if fut is not None:  # resolved under the lock, so take_ack sees done() or marks it taken first
                if event.event_id in self._taken:
                    self._taken.discard(event.event_id)
                    del self._waiters[event.event_id]
                if error is None:
                    fut.set_result(None)
                else:
                    fut.set_exception(error)
            self._cond.notify_all()
        if error is not None:
            log.error("gateway event %s %s was not stored: %s", event.kind, event.event_id, error)
        if self._user_callback is not None:
            self._user_callback(event, error)

    def _run(self) -> None:
        batch: list[Event] = []
        while True:
            with self._cond:
                while not self._has_work(batch) and self.failing is None and not self._closing:
                    self._cond.wait()
                if not self._has_work(batch) and self.failing is None and self._closing:
                    return
                while (self._redeliver or self._queue) and len(batch) < self.batch_size:
                    batch.append((self._redeliver or self._queue).popleft())
            del batch[: self._hand_on(batch)]
            if batch or not self._flush():
                with self._cond:  # the transport is failing: wait, then retry what is left (never drop)
                    self._cond.wait(self.retry_s)

    def _has_work(self, batch: list[Event]) -> bool:
        return bool(self._queue or self._redeliver or batch)

    def _hand_on(self, batch: list[Event]) -> int:
        """Send ``batch`` to ``inner`` in order; returns how many were accepted before a failure."""
        for k, event in enumerate(batch):
            try:
                self._send_one(event)
            except Exception as exc:  # the transport refused: keep the rest, in order, for the retry
                self._mark_failing(exc)
                return k
        return len(batch)

    def _send_one(self, event: Event) -> None:
        try:
            self.inner.send(event)
        except DeliveryError:  # earlier events' failures (already reported per event); ours is not in yet
            self.inner.send(event)

    def _flush(self) -> bool:
        try:
            self.inner.flush(self.flush_timeout_s)
        except DeliveryError:
            pass  # rejected events were reported one by one through the delivery callback
        except Exception as exc:
            self._mark_failing(exc)
            return False
        with self._cond:
            if self._redeliver:  # the transport gave events back: still failing until they are in
                return False
            self.failing = None
        return True

    def _mark_failing(self, exc: BaseException) -> None:
        log.warning("gateway recorder: transport failing, will retry: %s", exc)
        with self._cond:
            self.failing = exc
            self._cond.notify_all()

    # -- waiting and closing --------------------------------------------------------------------------
    def wait_until(self, predicate_name: str, timeout: float) -> bool:
        """Wait until ``idle`` (nothing undelivered), ``failing``, ``healthy`` or ``gave_back`` (the transport
        gave at least one accepted event back, to be sent again); False on timeout."""
        checks = {
            "idle": lambda: self._undelivered == 0,
            "failing": lambda: self.failing is not None,
            "healthy": lambda: self.failing is None,
            "gave_back": lambda: self.redelivered > 0,
        }
        with self._cond:
            return self._cond.wait_for(checks[predicate_name], timeout)

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every queued event's fate is known."""
        if not self.wait_until("idle", timeout if timeout is not None else 1e9):
            raise TransportError(f"flush: {self._undelivered} gateway event(s) still undelivered after {timeout} s")

    def close(self, timeout: float | None = None) -> None:
        """Drain the queue into ``inner`` and stop the thread (``inner`` stays open: its owner closes it)."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TransportError(f"close: {self._undelivered} gateway event(s) not delivered after {timeout} s")


__all__ = ["ACK_MODES", "Admission", "BackgroundRecorder"]
