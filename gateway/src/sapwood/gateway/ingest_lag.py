"""Back-pressure on ingest lag: how far the ingest consumer group is behind the events topic.

:class:`KafkaGroupLag` reads the lag the way Kafka's own tooling does: per partition, the log-end
offset minus the group's committed offset (the ingest commits to Kafka after each database commit),
or minus the log-start offset while the group has committed nothing there; summed over partitions,
in records. :class:`LagGuard` reads it on its own thread every ``interval_s`` seconds and says whether
the last reading passed the limit; the gateway then refuses calls (429) or forwards them unrecorded
(``--fail-open``), as it does while the transport is down.
"""

from __future__ import annotations

import logging
import threading
import warnings
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

#: Reads the current lag, in records (raises when it cannot be read).
LagReader = Callable[[], int]


class KafkaGroupLag:
    """Σ over ``topic``'s partitions of (log-end offset − ``group``'s committed offset), in records."""

    def __init__(self, bootstrap: str, topic: str, group: str) -> None:
        self.bootstrap, self.topic, self.group = bootstrap, topic, group
        self._consumer: Any = None
        self._admin: Any = None

    def _clients(self) -> tuple[Any, Any]:
        if self._consumer is None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                from kafka import KafkaAdminClient, KafkaConsumer
            self._consumer = KafkaConsumer(bootstrap_servers=self.bootstrap, client_id="sapwood-gateway-lag",
                                           enable_auto_commit=False)
            self._admin = KafkaAdminClient(bootstrap_servers=self.bootstrap, client_id="sapwood-gateway-lag")
        return self._consumer, self._admin

    def __call__(self) -> int:
        from kafka import TopicPartition

        consumer, admin = self._clients()
        parts = consumer.partitions_for_topic(self.topic) or set()
        tps = [TopicPartition(self.topic, p) for p in sorted(parts)]
        if not tps:
            return 0
        ends = consumer.end_offsets(tps)
        offsets = admin.list_group_offsets({self.group: tps}).get(self.group, {})
        committed = {tp: meta.offset for tp, meta in offsets.items()
                     if meta is not None and meta.offset is not None and meta.offset >= 0}
        missing = [tp for tp in tps if tp not in committed]
        starts = consumer.beginning_offsets(missing) if missing else {}
        return sum(max(0, int(ends[tp]) - int(committed.get(tp, starts.get(tp, 0)))) for tp in tps)

    def close(self) -> None:
        for client in (self._consumer, self._admin):
            if client is not None:
                client.close()
        self._consumer = self._admin = None


class LagGuard:
    """Reads ``read_lag`` every ``interval_s`` seconds on a thread; :attr:`over` once a reading passed ``limit``.

    A reading that fails keeps the last good one (logged; a broker that is down already fails the
    transport). ``on_reading`` gets each good reading (a metric)."""

    def __init__(self, read_lag: LagReader, limit: int, *, interval_s: float = 2.0,
                 on_reading: Callable[[int], None] | None = None) -> None:
        if limit < 0:
            raise ValueError(f"the ingest lag limit must be >= 0 records, got {limit}")
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0 seconds, got {interval_s}")
        self.read_lag, self.limit, self.interval_s = read_lag, limit, interval_s
        self.on_reading = on_reading
        self.lag: int | None = None
        self.readings = 0
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sapwood-gateway-lag", daemon=True)

    @property
    def over(self) -> bool:
        """Whether the last reading passed the limit."""
        lag = self.lag
        return lag is not None and lag > self.limit

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                lag = int(self.read_lag())
            except Exception as exc:
                log.warning("gateway: ingest lag not read (keeping the last reading): %s", exc)
            else:
                with self._cond:
                    self.lag = lag
                    self.readings += 1
                    self._cond.notify_all()
                if self.on_reading is not None:
                    self.on_reading(lag)
            self._stop.wait(self.interval_s)

    def wait_for(self, predicate: Callable[[int], bool], timeout: float) -> bool:
        """Wait until a reading satisfies ``predicate``; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self.lag is not None and predicate(self.lag), timeout)

    def close(self, timeout: float = 30.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        closer = getattr(self.read_lag, "close", None)
        if callable(closer):
            closer()


__all__ = ["KafkaGroupLag", "LagGuard", "LagReader"]
