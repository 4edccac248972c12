"""What the ingest service measures, through one sensor object (:class:`IngestSensor`).

The sensor keeps the running totals (:class:`IngestStats`), the lag per partition and the Prometheus
metrics (:class:`IngestMetrics`, one registry per service instance) in step: the service reports what
happened (a batch committed, a retry, a rebalance, a lag reading) and never touches a counter itself.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from sapwood.ingest.deadletters import DeadLetter
from sapwood.ingest.liveness import Liveness, serve_health
from sapwood.platform.apply import ApplyResult

log = logging.getLogger(__name__)


class IngestMetrics:
    """Counters are totals: events/s and tokens/s are their ``rate()``."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.events = Counter("sapwood_ingest_events", "Events applied to the store", registry=r)
        self.tokens = Counter("sapwood_ingest_tokens", "Token ids carried by applied events", registry=r)
        self.duplicates = Counter("sapwood_ingest_duplicates", "Events skipped as already stored", registry=r)
        self.dead_letters = Counter("sapwood_ingest_dead_letters", "Records sent to the dead letters", ["reason"],
                                    registry=r)
        self.batches = Counter("sapwood_ingest_batches", "Committed ingest transactions", registry=r)
        self.retries = Counter("sapwood_ingest_retries", "Batches rolled back and re-read from stored offsets",
                               registry=r)
        self.rebalances = Counter("sapwood_ingest_rebalances",
                                  "Partition assignments received (one per rebalance this process takes part in)",
                                  registry=r)
        self.lag = Gauge("sapwood_ingest_lag", "Log-end offset minus stored offset", ["topic", "partition"],
                         registry=r)
        self.since_progress = Gauge(
            "sapwood_ingest_seconds_since_progress",
            "Seconds since the partition's stored offset last moved (or it had nothing left to read)",
            ["topic", "partition"], registry=r)
        self.apply_seconds = Histogram(
            "sapwood_ingest_apply_seconds", "Seconds per ingest transaction (decode, apply, offsets, commit)",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0), registry=r,
        )
        self._server: Any = None

    def serve(self, port: int, addr: str = "127.0.0.1", liveness: Liveness | None = None) -> None:
        """Expose ``/metrics`` and ``/healthz`` on ``addr:port`` (loopback by default; ``0.0.0.0`` for every
        interface); ``/healthz`` answers from ``liveness`` (a fresh one when None)."""
        self._server = serve_health(port, addr, self.registry, liveness or Liveness())

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


@dataclass
class IngestStats:
    """Running totals of one service instance."""

    events: int = 0
    tokens: int = 0
    duplicates: int = 0
    dead_letters: int = 0
    batches: int = 0
    retries: int = 0
    db_errors: int = 0
    rebalances: int = 0
    """Partition assignments received: 1 for a lone member that never rebalanced."""
    first_batch_at: float | None = None
    """``time.monotonic()`` when the first batch began (throughput without start-up and group join)."""
    last_commit_at: float | None = None


class IngestSensor:
    """Totals, lag and Prometheus metrics of one service, updated together."""

    def __init__(self, metrics: IngestMetrics | None = None, *, lag_interval_s: float = 2.0,
                 liveness: Liveness | None = None) -> None:
        self.metrics = metrics or IngestMetrics()
        self.liveness = liveness or Liveness()
        self.stats = IngestStats()
        #: Last measured lag per partition (log-end offset − stored offset), in records.
        self.lag: dict[int, int] = {}
        self.lag_interval_s = lag_interval_s
        self._next_lag = 0.0

    def batch_started(self) -> None:
        if self.stats.first_batch_at is None:
            self.stats.first_batch_at = time.monotonic()

    def batch_done(self, result: ApplyResult, letters: Sequence[DeadLetter], seconds: float, *, advanced: bool) -> None:
        """A transaction committed: ``result`` applied, ``letters`` dead-lettered, in ``seconds``;
        ``advanced``: it moved at least one offset (it counts as a batch)."""
        n_events, tokens = len(result.applied), result.tokens
        s, m = self.stats, self.metrics
        s.events += n_events
        s.tokens += tokens
        s.duplicates += result.duplicates
        s.dead_letters += len(letters)
        m.events.inc(n_events)
        m.tokens.inc(tokens)
        m.duplicates.inc(result.duplicates)
        for dl in letters:
            m.dead_letters.labels(dl.reason).inc()
        if advanced:
            s.last_commit_at = time.monotonic()
            s.batches += 1
            m.batches.inc()
            m.apply_seconds.observe(seconds)

    def retried(self, *, db_error: bool = False) -> None:
        """A batch was rolled back and will be read again (``db_error``: because the database failed)."""
        if db_error:
            self.stats.db_errors += 1
        self.stats.retries += 1
        self.metrics.retries.inc()

    def rebalanced(self) -> None:
        self.stats.rebalances += 1
        self.metrics.rebalances.inc()

    def partition_revoked(self, topic: str, partition: int) -> None:
        self.lag.pop(partition, None)
        self.liveness.forget(partition)
        for gauge in (self.metrics.lag, self.metrics.since_progress):
            with contextlib.suppress(KeyError):
                gauge.remove(topic, str(partition))

    def report_lag(self, positions: Mapping[Any, int | None], end_offsets: Callable[[list[Any]], Mapping[Any, int]],
                   *, force: bool = False) -> None:
        """Every ``lag_interval_s`` (or when ``force``): lag = log-end offset − stored position of each held
        partition (``positions``: TopicPartition → next offset; ``end_offsets`` asks the broker)."""
        now = time.monotonic()
        if not force and now < self._next_lag:
            return
        self._next_lag = now + self.lag_interval_s
        if not positions:
            return
        try:
            ends = end_offsets(list(positions))
        except Exception as exc:
            log.debug("lag not measured: %s", exc)
            return
        for tp, end in ends.items():
            position = positions.get(tp) or 0
            lag = max(0, int(end) - position)
            self.lag[tp.partition] = lag
            self.metrics.lag.labels(tp.topic, str(tp.partition)).set(lag)
            if tp.partition not in self.liveness.partitions():
                self.metrics.since_progress.labels(tp.topic, str(tp.partition)).set_function(
                    functools.partial(self.liveness.seconds_since_progress, tp.partition))
            self.liveness.observe(tp.partition, position, lag)

    def serve(self, port: int, addr: str) -> None:
        self.metrics.serve(port, addr, self.liveness)

    def close(self) -> None:
        self.metrics.close()


__all__ = ["IngestMetrics", "IngestSensor", "IngestStats"]
