"""Signals from the real systems: Kafka ingest lag, the store's backlog, running executions, cells.

* the store's signals in one statement per tick
  (:func:`sapwood.platform.storage.scheduler_signals.read_snapshot`): backlog per live run (finished
  executions matching the run's filter that no learner holds: not queued yet, pending, or claimed under
  an expired lease, with their model-output tokens), in-flight executions (status running) and the age
  of the oldest, rollout and learner throughput over a window, staleness (latest published policy
  version − oldest policy version in the backlog), cells (a cell silent longer than ``lost_after_s`` is
  lost), recent switch phases, and the ingest's stored offsets;
* ingest lag per partition: log-end offsets from Kafka's admin API (``ListOffsets`` through a persistent
  :class:`kafka.KafkaAdminClient`) minus those stored offsets. The log-end offsets are cached between
  ticks: each tick uses the newest answer and, once ``lag_refresh_s`` has passed since the last
  request, asks for the next one in the background (at most one request in flight), so a tick never
  waits on the broker after the first, and the client's work (pure Python, sharing the interpreter
  with the tick) runs at most once per ``lag_refresh_s``. The log end a tick uses is at most
  ``lag_refresh_s`` plus one ``ListOffsets`` old, older than the stored offsets it is set against, so
  the lag can read low by what was produced meanwhile (bounded by that age), never high.
"""

from __future__ import annotations

import statistics
import time
import warnings
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from sapwood.platform.storage.backends import offset_store
from sapwood.platform.storage.scheduler_signals import LiveRuns, StoreSignals, read_snapshot
from sapwood.scheduler.signals import CellState, PartitionLag, RunBacklog, Signals, queue_demand


class KafkaLag:
    """Per-partition ingest lag of ``group`` on ``topic``; keeps one admin client open between reads."""

    def __init__(self, bootstrap: str, topic: str, group: str, *, timeout_s: float = 5.0) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            from kafka import KafkaAdminClient

        self.topic, self.group, self.timeout_ms = topic, group, int(timeout_s * 1000)
        self.admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="sapwood-scheduler-lag",
                                      request_timeout_ms=self.timeout_ms)
        self._partitions: list[int] | None = None

    def partitions(self) -> list[int]:
        if self._partitions is None:
            (meta,) = self.admin.describe_topics([self.topic])
            if meta.get("error_code"):
                raise RuntimeError(f"topic {self.topic!r}: broker error code {meta['error_code']}")
            self._partitions = sorted(int(p.get("partition_index", p.get("partition"))) for p in meta["partitions"])
        return self._partitions

    def log_end(self) -> dict[int, int]:
        from kafka import TopicPartition
        from kafka.admin import OffsetSpec

        specs = {TopicPartition(self.topic, p): OffsetSpec.LATEST for p in self.partitions()}
        got = self.admin.list_partition_offsets(specs, timeout_ms=self.timeout_ms)
        return {tp.partition: int(o.offset) for tp, o in got.items()}

    def stored(self, conn: Connection) -> dict[int, int]:
        return offset_store(conn).read(conn, self.group, self.topic)

    def combine(self, ends: dict[int, int], stored: dict[int, int]) -> tuple[PartitionLag, ...]:
        return tuple(PartitionLag(self.topic, p, end, stored.get(p, 0)) for p, end in sorted(ends.items()))

    def read(self, conn: Connection) -> tuple[PartitionLag, ...]:
        return self.combine(self.log_end(), self.stored(conn))

    def close(self) -> None:
        self.admin.close()


def switch_cost_mean(phases: list[tuple[str, str, float]]) -> float:
    """Mean duration of the recent switches: phases summed per (cell, target role)."""
    totals: dict[tuple[str, str], float] = {}
    for cell_id, role, d in phases:
        totals[(cell_id, role)] = totals.get((cell_id, role), 0.0) + d
    return statistics.fmean(totals.values()) if totals else 0.0


@dataclass
class LiveSignalReader:
    """Reads one :class:`Signals` snapshot per call from the store (and Kafka when ``lag`` is given)."""

    engine: sa.Engine
    batch_size: int
    train_step_cell_s: float = 0.0
    lag: KafkaLag | None = None
    window_s: float = 600.0
    lost_after_s: float = 30.0
    lag_refresh_s: float = 1.0
    queue: Callable[[], Mapping[str, Any]] | None = None
    """The router's queue lag (``Router.queue``: ``{"waiting", "occupied": {cell: slots}}``); when given,
    ``rollout_demand`` is waiting calls + occupied slots, else the running executions."""
    _pool: ThreadPoolExecutor | None = field(default=None, init=False, repr=False)
    _ends: dict[int, int] | None = field(default=None, init=False, repr=False)
    _asking: Future[dict[int, int]] | None = field(default=None, init=False, repr=False)
    _asked_at: float = field(default=-float("inf"), init=False, repr=False)
    _runs: LiveRuns = field(default_factory=LiveRuns, init=False, repr=False)

    def close(self) -> None:
        """Stop the lag thread and close the Kafka admin client."""
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        if self.lag is not None:
            self.lag.close()

    def log_end(self) -> dict[int, int]:
        """The newest log-end offsets answered, asking for the next ones in the background (see the module doc).

        Only the first call waits for the broker; a failed request is raised by the call that collects it.
        """
        assert self.lag is not None
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="sapwood-lag")
        if self._asking is not None and (self._ends is None or self._asking.done()):
            done, self._asking = self._asking, None
            self._ends = done.result()
        now = time.monotonic()
        if self._asking is None and (self._ends is None or now - self._asked_at >= self.lag_refresh_s):
            self._asking, self._asked_at = self._pool.submit(self.lag.log_end), now
            if self._ends is None:
                return self.log_end()
        assert self._ends is not None
        return self._ends

    def read(self, now: float | None = None) -> Signals:
        """One snapshot: the store's signals in one round trip, the broker's offsets from the cache."""
        now = time.time() if now is None else now
        ends = self.log_end() if self.lag is not None else None
        offsets = (self.lag.group, self.lag.topic) if self.lag is not None else None
        with self.engine.connect() as conn:
            snap = read_snapshot(conn, self._runs, now, self.window_s, offsets=offsets)
        lags = self.lag.combine(ends, snap.stored_offsets) if self.lag is not None and ends is not None else ()
        return self.signals(snap, now, lags)

    def signals(self, snap: StoreSignals, now: float, lags: tuple[PartitionLag, ...]) -> Signals:
        """The scheduler's :class:`Signals` from one store snapshot and the partitions' lag."""
        runs = tuple(RunBacklog(b.run_id, b.executions, b.output_tokens) for b in snap.backlogs)
        stale = max((b.latest_published - b.oldest_policy_version for b in snap.backlogs
                     if b.oldest_policy_version is not None and b.latest_published is not None), default=0)
        cells = tuple(CellState(c.cell_id, c.tier, c.capacity, c.role, c.role_since, c.last_heartbeat_at,
                                now - c.last_heartbeat_at > self.lost_after_s) for c in snap.cells)
        age = now - snap.oldest_running_started_at if snap.oldest_running_started_at is not None else 0.0
        demand, waiting = snap.in_flight, 0
        if self.queue is not None:
            q = self.queue()
            waiting = int(q["waiting"])
            cells = tuple(replace(c, occupied=int(q["occupied"].get(c.cell_id, 0))) for c in cells)
            demand = queue_demand(waiting, cells)
        w = self.window_s
        return Signals(
            at_s=now, cells=cells, batch_size=self.batch_size,
            backlog_executions=sum(r.executions for r in runs), backlog_tokens=sum(r.tokens for r in runs),
            backlog_by_run=runs, ingest_lag=lags, in_flight=snap.in_flight, in_flight_oldest_age_s=age,
            rollout_demand=demand, rollout_waiting=waiting, train_active=snap.claimed_live > 0,
            train_step_cell_s=self.train_step_cell_s, rollout_p50_s=snap.p50_duration_s,
            rollout_completions_per_s=snap.completions / w, rollout_tokens_per_s=snap.completed_tokens / w,
            learner_tokens_per_s=snap.trained_tokens / w, staleness_max=stale,
            switch_cost_mean_s=switch_cost_mean(snap.switch_phases),
        )
