"""Signals from the real systems: ingest lag against real Kafka, the backlog against real PostgreSQL."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from sapwood.platform import runs
from sapwood.platform import schema as t
from sapwood.platform.codec import encode, peek_key
from sapwood.platform.events import (
    CellHeartbeat,
    CellRegistered,
    ExecutionFinished,
    ModelCall,
    PolicyPublished,
    RoleAssigned,
)
from sapwood.platform.store import Store
from sapwood.scheduler.live_signals import KafkaLag, LiveSignalReader
from sapwood.scheduler.metrics import SchedulerMetrics
from tests.support.histories import small_execution
from tests.support.kafka_ingest import caught_up, create_topic, ingest_config, raw_producer, running_ingest, wait_until


def produce(bootstrap: str, topic: str, events: list) -> dict[int, int]:
    """Send ``events`` (keyed like the transport); return how many landed in each partition."""
    producer = raw_producer(bootstrap, acks="all")
    try:
        futures = [producer.send(topic, key=peek_key(e), value=encode(e)) for e in events]
        producer.flush()
        counts: dict[int, int] = {}
        for f in futures:
            p = f.get(timeout=30).partition
            counts[p] = counts.get(p, 0) + 1
        return counts
    finally:
        producer.close()


def test_ingest_lag_is_exactly_produced_minus_consumed(pg_url: str, kafka_bootstrap: str) -> None:
    store = Store.open(pg_url)
    topic = create_topic(kafka_bootstrap, partitions=4)
    config = ingest_config(pg_url, kafka_bootstrap, topic)
    n, m = 60, 25
    events = [CellRegistered(cell_id=f"cell-{i:03d}", capacity=1 + i % 4) for i in range(n)]
    produce(kafka_bootstrap, topic, events[:m])
    with running_ingest(config):
        wait_until(lambda: caught_up(store.engine, kafka_bootstrap, topic, config.group), 60, "ingest of M records")
    later = produce(kafka_bootstrap, topic, events[m:])  # ingest is stopped: these are the lag
    lag = KafkaLag(kafka_bootstrap, topic, config.group)
    try:
        with store.engine.connect() as conn:
            parts = lag.read(conn)
            stored = conn.execute(sa.select(sa.func.count()).select_from(t.cells)).scalar_one()
    finally:
        lag.close()
    assert stored == m, "ingest applied the first M cell events"
    assert [p.partition for p in parts] == [0, 1, 2, 3]
    assert {p.partition: p.lag for p in parts} == {p: later.get(p, 0) for p in range(4)}
    assert sum(p.lag for p in parts) == n - m
    metrics = SchedulerMetrics()
    reader = LiveSignalReader(store.engine, batch_size=8, lag=KafkaLag(kafka_bootstrap, topic, config.group))
    try:
        s = reader.read()
    finally:
        reader.close()
    metrics.observe(s)
    assert s.ingest_lag_total == n - m
    assert len(s.cells) == m
    assert sum(metrics.registry.get_sample_value("sapwood_scheduler_ingest_lag", {"topic": topic, "partition": str(p)})
               or 0 for p in range(4)) == n - m
    store.close()


def output_tokens(events: list) -> int:
    return sum(int(e.output_ids.size) for e in events if isinstance(e, ModelCall))


@pytest.mark.postgres
def test_backlog_counts_finished_unclaimed_executions_and_tokens(pg_url: str) -> None:
    store = Store.open(pg_url)
    finished = [small_execution(s) for s in range(6)]
    for w in finished:
        store.apply(w.events)
    running = small_execution(10)
    store.apply([e for e in running.events if not isinstance(e, ExecutionFinished)])
    store.apply([PolicyPublished(run_id="live-a", version=3)])
    now = time.time()
    with store.transaction() as conn:
        runs.create_run(conn, "live-a", runs.ExecutionFilter(run_id="synthetic"), kind="live")
        runs.create_run(conn, "replay-b", runs.ExecutionFilter(), kind="replay")  # not live: not reported
        assert runs.sync_run(conn, "live-a") == 4 + 2  # all six finished are queued
        claimed = runs.claim(conn, "live-a", "learner-1", 2, lease_s=600)
        runs.complete(conn, "live-a", "learner-1", claimed[:1])  # one trained, one still held
        expired = runs.claim(conn, "live-a", "learner-2", 1, lease_s=600)
        conn.execute(t.run_items.update().where(t.run_items.c.execution_id == expired[0])
                     .values(lease_until=now - 1))  # a crashed learner's lease ran out: claimable again
    held = set(claimed)
    expected = [w for w in finished if w.execution_id not in held]
    read = LiveSignalReader(store.engine, batch_size=4).read(now)
    (b,), stale = read.backlog_by_run, read.staleness_max
    n_flight, age = read.in_flight, read.in_flight_oldest_age_s
    assert (b.run_id, b.executions) == ("live-a", len(expected))
    assert len(expected) == 4
    assert b.tokens == sum(output_tokens(w.events) for w in expected) > 0
    assert stale == 3  # latest published 3, synthetic executions carry policy version 0
    assert n_flight == 1
    assert age > 0
    # cells: a silent one is lost
    store.apply([CellRegistered(cell_id="a", created_at=now - 100), CellRegistered(cell_id="b", created_at=now - 100),
                 CellHeartbeat(cell_id="a", created_at=now - 1)])
    s = LiveSignalReader(store.engine, batch_size=4, lost_after_s=30).read(now)
    assert {c.cell_id: c.lost for c in s.cells} == {"a": False, "b": True}
    assert s.backlog_executions == 4
    assert s.in_flight == 1
    assert s.rollout_demand == 1, "without a router: the running executions"
    # with the router's queue: waiting calls + occupied slots of live rollout cells (b is lost)
    store.apply([RoleAssigned(cell_id=c, role="rollout", created_at=now - 50) for c in ("a", "b")])
    q = LiveSignalReader(store.engine, batch_size=4, lost_after_s=30,
                         queue=lambda: {"waiting": 3, "occupied": {"a": 2, "b": 1}}).read(now)
    assert {c.cell_id: c.occupied for c in q.cells} == {"a": 2, "b": 1}
    assert q.rollout_waiting == 3
    assert q.rollout_demand == 3 + 2
    store.close()


class GatedLag(KafkaLag):
    """A lag source whose log-end requests wait on a gate, answering 100 × the request number."""

    def __init__(self) -> None:  # no broker: only what LiveSignalReader asks of a lag
        self.topic, self.group = "t", "g"
        self.asked = 0
        self.gate = threading.Event()
        self.gate.set()

    def log_end(self) -> dict[int, int]:
        self.gate.wait(30)
        self.asked += 1
        return {0: 100 * self.asked}

    def close(self) -> None:
        self.gate.set()


def test_log_end_offsets_are_cached_between_ticks_and_refreshed_in_the_background(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path / 's.db'}")
    lag = GatedLag()
    reader = LiveSignalReader(store.engine, batch_size=4, lag=lag, lag_refresh_s=0.0)
    try:
        first = reader.read()
        assert [p.log_end for p in first.ingest_lag] == [100], "the first tick waits for an answer"
        wait_until(lambda: lag.asked == 2, 30, "the next request, in the background")
        lag.gate.clear()  # the broker stops answering
        second = reader.read()  # collects request 2, asks for request 3 (blocked)
        assert [p.log_end for p in second.ingest_lag] == [200]
        third = reader.read()  # request 3 still pending: the cached answer, no wait
        assert [p.log_end for p in third.ingest_lag] == [200]
        lag.gate.set()
        wait_until(lambda: lag.asked == 3, 30, "request 3 answered")
        assert [p.log_end for p in reader.read().ingest_lag] == [300]
    finally:
        reader.close()
        store.close()


def test_log_end_offsets_are_asked_for_at_most_once_per_refresh_interval(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path / 's.db'}")
    lag = GatedLag()
    reader = LiveSignalReader(store.engine, batch_size=4, lag=lag, lag_refresh_s=3600.0)
    try:
        for _ in range(5):
            assert [p.log_end for p in reader.read().ingest_lag] == [100]
        assert lag.asked == 1, "within the interval every tick uses the cached answer"
    finally:
        reader.close()
        store.close()
