"""Transports: where a recorder's events go, behind one small interface.

* :class:`KafkaTransport` — production: an idempotent Kafka producer (``acks=all``), keyed by
  execution id, compressed, batched, with a bounded in-memory buffer (backpressure) and
  delivery errors surfaced to the caller.
* :class:`InProcessTransport` — the embedded default: hands events to the store's apply
  function directly (the same :func:`~sapwood.platform.apply.apply_events` ingest uses).
* :class:`MemoryTransport` — keeps events in a list (tests, dry runs).

Every transport is thread-safe. Delivery failures are collected and raised as one
:class:`DeliveryError` from the next ``send``, ``flush`` or ``close``.
"""

from __future__ import annotations

import logging
import threading
import time
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, Self

from sapwood.platform.codec import encode, payload_size, peek_key
from sapwood.platform.errors import SapwoodError, ValidationError
from sapwood.platform.events import Event, ExecutionFinished

if TYPE_CHECKING:
    from sapwood.platform.settings import Settings
    from sapwood.platform.store import Store

log = logging.getLogger(__name__)

#: Called once per event when its fate is known: ``(event, None)`` when stored/acknowledged,
#: ``(event, error)`` when it failed. Runs on the transport's I/O thread: keep it short.
DeliveryCallback = Callable[[Event, BaseException | None], None]

#: Largest encoded event by default: fits the stock broker limit (``message.max.bytes`` ≈ 1 MiB).
DEFAULT_MAX_EVENT_BYTES = 1_000_000
Compression = Literal["auto", "zstd", "lz4", "gzip", "snappy", "codec", "none"]


class TransportError(SapwoodError):
    """Events could not be handed to the transport or were not delivered."""


class DeliveryError(TransportError):
    """Events that failed after they were accepted; ``failures`` lists ``(event, error)``."""

    def __init__(self, failures: list[tuple[Event, BaseException]]) -> None:
        first_event, first_error = failures[0]
        super().__init__(
            f"{len(failures)} event(s) were not delivered; first: {first_event.kind} {first_event.event_id} "
            f"(execution {first_event.execution_id} seq {first_event.seq}): {first_error}"
        )
        self.failures = failures


class BackpressureTimeout(TransportError):
    """The bounded send buffer stayed full for longer than ``max_block_s``."""


class EventTooLargeError(ValidationError):
    """An encoded event exceeds ``max_event_bytes`` (the topic's ``max.message.bytes``)."""

    reason = "too_large"


class Transport(ABC):
    """Destination of recorded events."""

    #: Largest encoded event this transport accepts (None: no limit). Recorders split long
    #: prompts/observations/inputs into several events to stay under it.
    max_event_bytes: int | None = None

    def __init__(self, *, on_delivery: DeliveryCallback | None = None) -> None:
        self.on_delivery = on_delivery
        self._failures: list[tuple[Event, BaseException]] = []
        self._failures_lock = threading.Lock()

    @abstractmethod
    def send(self, event: Event) -> None:
        """Hand ``event`` over; may block (backpressure). Raises pending delivery errors first."""

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every event sent so far is delivered; raise :class:`DeliveryError` on failures."""
        self.raise_pending()

    def close(self, timeout: float | None = None) -> None:
        """Flush and release resources."""
        self.flush(timeout)

    # -- failure bookkeeping ----------------------------------------------------------------------
    def _delivered(self, event: Event, error: BaseException | None) -> None:
        if error is not None:
            with self._failures_lock:
                self._failures.append((event, error))
        if self.on_delivery is not None:
            try:
                self.on_delivery(event, error)
            except Exception:  # a user callback must not break the I/O thread
                log.exception("on_delivery callback failed")

    def raise_pending(self) -> None:
        """Raise (and forget) the delivery failures collected so far."""
        with self._failures_lock:
            failures, self._failures = self._failures, []
        if failures:
            raise DeliveryError(failures)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc is None:
            self.close()
        else:  # do not hide the original error behind a delivery error
            try:
                self.close()
            except SapwoodError:
                log.exception("closing the transport after an error failed")


class MemoryTransport(Transport):
    """Keeps every event in ``events`` (tests, dry runs)."""

    def __init__(self, *, on_delivery: DeliveryCallback | None = None) -> None:
        super().__init__(on_delivery=on_delivery)
        self.events: list[Event] = []
        self._lock = threading.Lock()

    def send(self, event: Event) -> None:
        with self._lock:
            self.events.append(event)
        self._delivered(event, None)


class InProcessTransport(Transport):
    """Applies events to a :class:`~sapwood.platform.store.Store` in this process (embedded mode).

    Events are applied in batches of ``batch_size`` (one transaction each), and whenever an
    execution finishes, on :meth:`flush` and on :meth:`close`. Invalid events are not stored;
    they come back as a :class:`DeliveryError` (the rest of the batch is applied). A database
    error keeps the batch buffered: calling :meth:`flush` again retries it.
    """

    def __init__(self, store: Store, *, batch_size: int = 64, on_delivery: DeliveryCallback | None = None,
                 close_store: bool = False) -> None:
        super().__init__(on_delivery=on_delivery)
        if batch_size < 1:
            raise ValueError(f"batch_size must be ≥ 1, got {batch_size}")
        self.store = store
        self.batch_size = batch_size
        self.close_store = close_store
        self._buffer: list[Event] = []
        self._lock = threading.RLock()

    def send(self, event: Event) -> None:
        self.raise_pending()
        with self._lock:
            self._buffer.append(event)
            if len(self._buffer) >= self.batch_size or isinstance(event, ExecutionFinished):
                self._apply_buffer()

    def _apply_buffer(self) -> None:
        with self._lock:
            if not self._buffer:
                return
            batch = list(self._buffer)
            result = self.store.apply(batch, strict=False)  # StoreError: the batch stays buffered
            self._buffer.clear()
        rejected = {id(r.event): r.error for r in result.rejected}
        for ev in batch:
            self._delivered(ev, rejected.get(id(ev)))

    def flush(self, timeout: float | None = None) -> None:
        self._apply_buffer()
        self.raise_pending()

    def close(self, timeout: float | None = None) -> None:
        try:
            self.flush(timeout)
        finally:
            if self.close_store:
                self.store.close()


class ByteBudget:
    """A bounded count of bytes in flight: ``acquire`` blocks while the budget is spent."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._cond = threading.Condition()

    def acquire(self, n: int, timeout: float) -> bool:
        """Take ``n`` bytes, waiting up to ``timeout`` s; False on timeout. One oversize item may
        pass when nothing else is in flight, so progress never stalls."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self.used > 0 and self.used + n > self.limit:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
            self.used += n
            return True

    def release(self, n: int) -> None:
        with self._cond:
            self.used -= n
            self._cond.notify_all()

    def wait_empty(self, timeout: float | None) -> bool:
        """Wait until nothing is in flight; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self.used == 0, timeout)


def _kafka_compression(choice: Compression) -> tuple[str | None, bool]:
    """(kafka-python ``compression_type``, compress with the codec's own zstd flag)."""
    from kafka import codec

    available = {"zstd": codec.has_zstd, "lz4": codec.has_lz4, "gzip": codec.has_gzip, "snappy": codec.has_snappy}
    if choice == "auto":
        for name in ("zstd", "lz4"):
            if available[name]():
                return name, False
        return None, True
    if choice == "codec":
        return None, True
    if choice == "none":
        return None, False
    if choice not in available:
        raise ValueError(f"compression must be one of auto, zstd, lz4, gzip, snappy, codec, none; got {choice!r}")
    if not available[choice]():
        raise ValueError(f"compression {choice!r}: its library is not installed (kafka-python codec)")
    return choice, False


class KafkaTransport(Transport):
    """Idempotent Kafka producer of TITO events, keyed by execution id.

    ``max_buffer_bytes`` bounds the encoded bytes sent but not yet acknowledged; ``send``
    blocks while the buffer is full and raises :class:`BackpressureTimeout` after
    ``max_block_s``. The producer retries transient broker errors (a broker restart)
    until ``delivery_timeout_s``; whatever still fails is raised as :class:`DeliveryError`.
    """

    def __init__(
        self,
        bootstrap: str,
        *,
        topic: str = "sapwood.events",
        compression: Compression = "auto",
        linger_ms: int = 5,
        batch_bytes: int = 256 * 1024,
        max_buffer_bytes: int = 64 * 1024 * 1024,
        max_block_s: float = 60.0,
        max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
        delivery_timeout_s: float = 120.0,
        client_id: str | None = None,
        on_delivery: DeliveryCallback | None = None,
        **producer_config: Any,
    ) -> None:
        super().__init__(on_delivery=on_delivery)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            from kafka import KafkaProducer

        if max_buffer_bytes < max_event_bytes:
            raise ValueError(f"max_buffer_bytes ({max_buffer_bytes}) must be ≥ max_event_bytes ({max_event_bytes})")
        self.topic = topic
        self.max_event_bytes = self._max_event_bytes = max_event_bytes
        self.max_buffer_bytes = max_buffer_bytes
        self.max_block_s = max_block_s
        kafka_compression, self._codec_compress = _kafka_compression(compression)
        self.compression = kafka_compression or ("codec" if self._codec_compress else "none")
        config: dict[str, Any] = {
            "bootstrap_servers": bootstrap,
            "client_id": client_id or "sapwood-recorder",
            "enable_idempotence": True,
            "acks": "all",
            "compression_type": kafka_compression,
            "linger_ms": linger_ms,
            "batch_size": batch_bytes,
            "max_request_size": max(1024 * 1024, max_event_bytes + 4096),
            "delivery_timeout_ms": int(delivery_timeout_s * 1000),
            "request_timeout_ms": max(1000, min(30_000, int(delivery_timeout_s * 1000) - linger_ms - 1)),
            "max_block_ms": int(max_block_s * 1000),
            "max_in_flight_requests_per_connection": 5,
            "reconnect_backoff_max_ms": 1000,  # back within a second of a broker restart
        }
        config.update(producer_config)
        try:
            self._producer = KafkaProducer(**config)
        except Exception as exc:
            raise TransportError(f"cannot connect a Kafka producer to {bootstrap}: {exc}") from exc
        self._budget = ByteBudget(max_buffer_bytes)
        self._closed = False
        self.sent = 0
        self.acked = 0

    @property
    def buffered_bytes(self) -> int:
        """Encoded bytes sent but not yet acknowledged."""
        return self._budget.used

    # -- interface ----------------------------------------------------------------------------------
    def send(self, event: Event) -> None:
        if self._closed:
            raise TransportError("transport is closed")
        self.raise_pending()
        data = encode(event, compress=self._codec_compress)
        decoded = payload_size(data) if self._codec_compress else None
        if len(data) > self._max_event_bytes or (decoded or 0) > self._max_event_bytes:
            raise EventTooLargeError(
                f"{event.kind} {event.event_id} encodes to {len(data):,} bytes ({decoded or len(data):,} "
                f"decompressed; ingest bounds both), above max_event_bytes="
                f"{self.max_event_bytes:,}; raise the topic's max.message.bytes and max_event_bytes together",
                event_id=event.event_id,
            )
        size = len(data)
        if not self._budget.acquire(size, self.max_block_s):
            raise BackpressureTimeout(
                f"send buffer full ({self._budget.used:,} of {self.max_buffer_bytes:,} bytes unacknowledged) "
                f"for {self.max_block_s} s; is the broker reachable?"
            )
        try:
            future = self._producer.send(self.topic, value=data, key=peek_key(event))
        except Exception as exc:
            self._budget.release(size)
            raise TransportError(f"Kafka refused {event.kind} {event.event_id}: {exc}") from exc
        self.sent += 1

        def ok(_metadata: Any) -> None:
            self.acked += 1
            self._budget.release(size)
            self._delivered(event, None)

        def failed(exc: BaseException) -> None:
            self._budget.release(size)
            self._delivered(event, exc)

        future.add_callback(ok)
        future.add_errback(failed)

    def flush(self, timeout: float | None = None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            self._producer.flush(timeout=timeout)
        except Exception as exc:  # e.g. a batch split after MessageSizeTooLarge: wait on the records themselves
            log.debug("producer flush: %s", exc)
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not self._budget.wait_empty(remaining):
            raise TransportError(f"flush: {self._budget.used:,} bytes still unacknowledged after {timeout} s")
        self.raise_pending()

    def close(self, timeout: float | None = None) -> None:
        if self._closed:
            self.raise_pending()
            return
        try:
            self.flush(timeout)
        finally:
            self._closed = True
            self._producer.close(timeout=timeout if timeout is not None else 30)


def make_transport(settings: Settings | None = None, **kwargs: Any) -> Transport:
    """Kafka when ``SAPWOOD_KAFKA_BOOTSTRAP`` is set, else in-process into ``SAPWOOD_DATABASE_URL``."""
    from sapwood.platform.settings import Settings

    s = settings or Settings()
    if s.kafka_bootstrap:
        kwargs.setdefault("max_event_bytes", s.max_event_bytes)
        return KafkaTransport(s.kafka_bootstrap, topic=s.kafka_topic, **kwargs)
    from sapwood.platform.store import Store

    return InProcessTransport(Store.open(s.database_url), close_store=True, **kwargs)


__all__ = [
    "DEFAULT_MAX_EVENT_BYTES",
    "BackpressureTimeout",
    "ByteBudget",
    "DeliveryCallback",
    "DeliveryError",
    "EventTooLargeError",
    "InProcessTransport",
    "KafkaTransport",
    "MemoryTransport",
    "Transport",
    "TransportError",
    "make_transport",
]
