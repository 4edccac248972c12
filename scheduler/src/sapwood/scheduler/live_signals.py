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

from sapwood.platform import schema as t
from sapwood.platform.runs import FINISHED, ExecutionFilter
from sapwood.scheduler.signals import CellState, PartitionLag, RunBacklog, Signals

_e = t.executions.c
_ri = t.run_items.c


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
        c = t.consumer_offsets.c
        return {int(p): int(o) for p, o in conn.execute(
            sa.select(c.partition, c.next_offset).where(c.group_id == self.group, c.topic == self.topic))}

    def combine(self, ends: dict[int, int], stored: dict[int, int]) -> tuple[PartitionLag, ...]:
        return tuple(PartitionLag(self.topic, p, end, stored.get(p, 0)) for p, end in sorted(ends.items()))

    def read(self, conn: Connection) -> tuple[PartitionLag, ...]:
        return self.combine(self.log_end(), self.stored(conn))

    def close(self) -> None:
        self.admin.close()


def backlog(conn: Connection, now: float) -> tuple[tuple[RunBacklog, ...], int]:
    """Finished-but-unclaimed executions and their output tokens per live run, and the largest staleness."""
    out, stale = [], 0
    for run in conn.execute(sa.select(t.runs).where(t.runs.c.kind == "live").order_by(t.runs.c.run_id)).mappings():
        flt = ExecutionFilter.model_validate(run["filter"])
        unheld = sa.or_(_ri.execution_id.is_(None), _ri.state == "pending",
                        sa.and_(_ri.state == "claimed", _ri.lease_until < now))
        join = t.executions.outerjoin(t.run_items, sa.and_(_ri.run_id == run["run_id"],
                                                           _ri.execution_id == _e.execution_id))
        publish = (run["config"] or {}).get("publish_run_id", run["run_id"])
        latest_q = (sa.select(sa.func.max(t.policy_versions.c.version))
                    .where(t.policy_versions.c.run_id == publish).scalar_subquery())
        q = (sa.select(sa.func.count(), sa.func.coalesce(sa.func.sum(_e.n_output_tokens), 0),
                       sa.func.min(_e.max_policy_version), latest_q)
             .select_from(join)
             .where(flt.where(), _e.status.in_(FINISHED), unheld))
        n, tokens, oldest, latest = conn.execute(q).one()
        out.append(RunBacklog(run["run_id"], int(n), int(tokens)))
        if oldest is not None and latest is not None:
            stale = max(stale, int(latest) - int(oldest))
    return tuple(out), stale


def in_flight(conn: Connection, now: float) -> tuple[int, float]:
    n, oldest = conn.execute(sa.select(sa.func.count(), sa.func.min(_e.started_at))
                             .where(_e.status == "running")).one()
    return int(n), (now - float(oldest)) if oldest is not None else 0.0


def throughput(conn: Connection, now: float, window_s: float) -> dict[str, float]:
    """Rollout completions/s and tokens/s, the median duration of the last 256 finished, learner tokens/s."""
    since = now - window_s
    n, tokens = conn.execute(sa.select(sa.func.count(), sa.func.coalesce(sa.func.sum(_e.n_output_tokens), 0))
                             .where(_e.finished_at >= since)).one()
    recent = conn.execute(sa.select(_e.finished_at - _e.started_at).where(_e.finished_at.is_not(None))
                          .order_by(_e.finished_at.desc()).limit(256)).scalars().all()
    trained = conn.execute(sa.select(sa.func.coalesce(sa.func.sum(_e.n_output_tokens), 0))
                           .select_from(t.run_items.join(t.executions, _e.execution_id == _ri.execution_id))
                           .where(_ri.state == "done", _ri.done_at >= since)).scalar_one()
    active = conn.execute(sa.select(sa.func.count()).select_from(t.run_items)
                          .where(_ri.state == "claimed", _ri.lease_until >= now)).scalar_one()
    return {"completions_per_s": int(n) / window_s, "tokens_per_s": int(tokens) / window_s,
            "p50_s": float(statistics.median(recent)) if recent else 0.0,
            "learner_tokens_per_s": int(trained) / window_s, "train_active": float(active > 0)}


def cells(conn: Connection, now: float, lost_after_s: float) -> tuple[CellState, ...]:
    rows = conn.execute(sa.select(t.cells).order_by(t.cells.c.cell_id)).mappings().all()
    return tuple(CellState(r["cell_id"], r["tier"], int(r["capacity"]), r["role"], float(r["role_since"]),
                           float(r["last_heartbeat_at"]), now - float(r["last_heartbeat_at"]) > lost_after_s)
                 for r in rows)


def switch_cost_mean(conn: Connection, last: int = 64) -> float:
    """Mean duration of the recent switches: phases summed per (cell, target role) run of consecutive rows."""
    c = t.switch_phases.c
    rows = conn.execute(sa.select(c.cell_id, c.role, c.duration_s).order_by(c.at.desc(), c.event_id).limit(last)).all()
    totals: dict[tuple[str, str], float] = {}
    for cell_id, role, d in rows:
        totals[(cell_id, role)] = totals.get((cell_id, role), 0.0) + float(d)
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
