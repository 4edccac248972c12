"""End to end: the live scheduler decides from real Kafka lag and the store; its decisions travel through
Kafka and ingest into the cells projection; a tick before ingest catches up does not repeat them."""

from __future__ import annotations

import time

import sqlalchemy as sa

from sapwood.platform import runs
from sapwood.platform import schema as t
from sapwood.platform.events import CellHeartbeat, CellRegistered, ExecutionFinished
from sapwood.platform.store import Store
from sapwood.rollout import KafkaTransport
from sapwood.scheduler.live_loop import SchedulerLoop
from sapwood.scheduler.live_signals import KafkaLag, LiveSignalReader
from sapwood.scheduler.policies import ElasticPolicy
from tests.support.histories import small_execution
from tests.support.kafka_ingest import caught_up, create_topic, ingest_config, running_ingest, wait_until


def test_decisions_through_kafka_and_ingest(pg_url: str, kafka_bootstrap: str) -> None:
    store = Store.open(pg_url)
    topic = create_topic(kafka_bootstrap, partitions=4)
    config = ingest_config(pg_url, kafka_bootstrap, topic)
    now = time.time()
    for s in range(4):
        store.apply(small_execution(s).events)
    store.apply([e for e in small_execution(9).events if not isinstance(e, ExecutionFinished)])
    with store.transaction() as conn:
        runs.create_run(conn, "live", runs.ExecutionFilter(run_id="synthetic"), kind="live")
    transport = KafkaTransport(kafka_bootstrap, topic=topic)
    for i in range(4):  # the cells register themselves through Kafka like any producer
        transport.send(CellRegistered(cell_id=f"cell-{i}", capacity=2, created_at=now - 120))
        transport.send(CellHeartbeat(cell_id=f"cell-{i}", created_at=now))
    transport.flush()
    reader = LiveSignalReader(store.engine, batch_size=4, train_step_cell_s=600.0,
                              lag=KafkaLag(kafka_bootstrap, topic, config.group))
    loop = SchedulerLoop(reader.read, ElasticPolicy(min_dwell_s=0), transport)
    try:
        before = reader.read()
        assert before.ingest_lag_total == 8
        assert before.cells == ()  # nothing ingested yet: all of it is lag
        with running_ingest(config):
            wait_until(lambda: caught_up(store.engine, kafka_bootstrap, topic, config.group), 60, "cells ingested")
            first = loop.tick()
            assert first.signals.ingest_lag_total == 0
            assert len(first.signals.cells) == 4
            assert first.moves, first.decision.reasons
            second = loop.tick()  # whether or not ingest has applied the decisions yet, none is repeated
            assert not set(second.moves) & set(first.moves)
            wait_until(lambda: caught_up(store.engine, kafka_bootstrap, topic, config.group), 60, "decisions")
        with store.engine.connect() as conn:
            decided = {r.cell_id: r.role for r in conn.execute(sa.select(t.scheduler_decisions))}
            roles = {r.cell_id: r.role for r in conn.execute(sa.select(t.cells))}
        assert decided == {c: new for c, (_, new) in {**first.moves, **second.moves}.items()}
        assert all(roles[c] == r for c, r in decided.items())
        hash_live = store.projection_hash()
        store.rebuild_projections()
        assert store.projection_hash() == hash_live
    finally:
        reader.close()
        transport.close()
        store.close()
