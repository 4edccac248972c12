"""Signals from the real systems: Kafka ingest lag, the store's backlog, running executions, cells.

* ingest lag per partition: log-end offsets from Kafka's admin API (``ListOffsets`` through a persistent
  :class:`kafka.KafkaAdminClient`) minus the next offsets ingest stored in ``consumer_offsets``;
* backlog per live run: finished executions matching the run's filter that no learner holds (not queued
  yet, pending, or claimed under an expired lease), with their model-output (trainable) tokens;
* in-flight executions (status running) and the age of the oldest; rollout and learner throughput over
  a window; staleness (latest published policy version − oldest policy version in the backlog);
* cells from the ``cells`` projection; a cell silent longer than ``lost_after_s`` is lost.
"""

from __future__ import annotations

import statistics
import time
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import sqlalchemy as sa
from sqlalchemy.engine import Connection

import sapwood.platform.storage.scheduler_signals as signal_reads
from sapwood.platform.storage.backends import offset_store
from sapwood.platform.storage.cells import cells as stored_cells
from sapwood.platform.storage.scheduler_signals import in_flight
from sapwood.platform.storage.scheduler_signals import throughput as throughput
from sapwood.scheduler.signals import CellState, PartitionLag, RunBacklog, Signals


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


def backlog(conn: Connection, now: float) -> tuple[tuple[RunBacklog, ...], int]:
    """Finished-but-unclaimed executions and their output tokens per live run, and the largest staleness."""
    out, stale = [], 0
    for b in signal_reads.live_run_backlogs(conn, now):
        out.append(RunBacklog(b.run_id, b.executions, b.output_tokens))
        if b.oldest_policy_version is not None and b.latest_published is not None:
            stale = max(stale, b.latest_published - b.oldest_policy_version)
    return tuple(out), stale


def cells(conn: Connection, now: float, lost_after_s: float) -> tuple[CellState, ...]:
    return tuple(CellState(r["cell_id"], r["tier"], int(r["capacity"]), r["role"], float(r["role_since"]),
                           float(r["last_heartbeat_at"]), now - float(r["last_heartbeat_at"]) > lost_after_s)
                 for r in stored_cells(conn))


def switch_cost_mean(conn: Connection, last: int = 64) -> float:
    """Mean duration of the recent switches: phases summed per (cell, target role) run of consecutive rows."""
    totals: dict[tuple[str, str], float] = {}
    for cell_id, role, d in signal_reads.recent_switch_phases(conn, last):
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
    _pool: ThreadPoolExecutor | None = field(default=None, init=False, repr=False)

    def close(self) -> None:
        """Stop the lag thread and close the Kafka admin client."""
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        if self.lag is not None:
            self.lag.close()

    def read(self, now: float | None = None) -> Signals:
        """One snapshot; the broker's log-end offsets are asked for while the store is read (one thread)."""
        now = time.time() if now is None else now
        ends: Future[dict[int, int]] | None = None
        if self.lag is not None:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="sapwood-lag")
            ends = self._pool.submit(self.lag.log_end)
        with self.engine.connect() as conn:
            stored = self.lag.stored(conn) if self.lag is not None else {}
            runs, stale = backlog(conn, now)
            n_flight, age = in_flight(conn, now)
            tp = throughput(conn, now, self.window_s)
            cell_states = cells(conn, now, self.lost_after_s)
            switch = switch_cost_mean(conn)
        lags = self.lag.combine(ends.result(), stored) if self.lag is not None and ends is not None else ()
        return Signals(
            at_s=now, cells=cell_states, batch_size=self.batch_size,
            backlog_executions=sum(r.executions for r in runs), backlog_tokens=sum(r.tokens for r in runs),
            backlog_by_run=runs, ingest_lag=lags, in_flight=n_flight, in_flight_oldest_age_s=age,
            rollout_demand=n_flight, train_active=bool(tp["train_active"]),
            train_step_cell_s=self.train_step_cell_s, rollout_p50_s=tp["p50_s"],
            rollout_completions_per_s=tp["completions_per_s"], rollout_tokens_per_s=tp["tokens_per_s"],
            learner_tokens_per_s=tp["learner_tokens_per_s"], staleness_max=stale,
            switch_cost_mean_s=switch,
        )
