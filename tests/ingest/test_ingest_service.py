"""The ingest service against real Kafka and PostgreSQL: dead letters, database faults, resume, metrics."""

from __future__ import annotations

import dataclasses
import random
import socket
import threading
import time
import urllib.request
import warnings
from collections import Counter

import numpy as np
import psycopg
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from sapwood.ingest.topics import end_offsets
from sapwood.platform import schema as t
from sapwood.platform.codec import encode
from sapwood.platform.events import Event, ExecutionStarted, Prompt
from sapwood.platform.storage.backends import offset_store
from sapwood.platform.store import Store
from sapwood.platform.synthetic import SynthConfig, synthetic_execution
from sapwood.rollout import KafkaTransport

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka import KafkaConsumer

from tests.support.kafka_ingest import (
    Ledger,
    caught_up,
    check_exactly_once,
    count_rows,
    create_topic,
    ingest_config,
    raw_producer,
    running_ingest,
    wait_until,
)

SMALL = SynthConfig(calls=10, forks=1, fork_depth=2, segments=2, obs_min=5, obs_max=40, out_min=3, out_max=20,
                    system_tokens=30, task_tokens=10, summary_tokens=8, vocab_size=500)


def small(seed: int, **kw: object) -> list[Event]:
    return synthetic_execution(SynthConfig(**{**SMALL.__dict__, "seed": seed, **kw})).events


def test_poison_records_are_dead_lettered_and_the_partition_keeps_flowing(pg_url: str, kafka_bootstrap: str) -> None:
    topic = create_topic(kafka_bootstrap, 1, configs={"max.message.bytes": str(16 * 1024 * 1024)})
    dlq = create_topic(kafka_bootstrap, 1, prefix="test-dlq")
    store = Store.open(pg_url)
    a, d = small(1), small(2)
    b = small(3)
    b_call = next(i for i, e in enumerate(b) if e.kind == "model_call")
    b[b_call].input_digest = "f" * 32  # type: ignore[attr-defined]
    c = small(4)
    future_schema = ExecutionStarted(run_id="r", task_id="t", execution_id=c[0].execution_id, seq=0,
                                     schema_version=99)
    huge = Prompt(execution_id=a[0].execution_id, seq=999, token_ids=np.zeros(2_700_000, dtype=np.int32))
    long_run = small(5)
    long_run[0].metadata = {"note": "a\x00b"}  # type: ignore[attr-defined]  # valid event, refused by PostgreSQL
    garbage = b"\x00\x01 definitely not a sapwood event"
    records: list[bytes] = [encode(e) for e in a[:5]]
    records += [garbage, encode(future_schema), encode(huge)]
    records += [encode(e) for e in b[: b_call + 1]]  # ... digest mismatch last
    records += [encode(e) for e in (c[0], c[2])]  # seq 0, then seq 2: a gap
    records += [encode(long_run[0])]
    records += [encode(e) for e in a[5:] + d]
    producer = raw_producer(kafka_bootstrap, max_request_size=20 * 1024 * 1024)
    for value in records:
        producer.send(topic, value=value, partition=0)
    producer.flush(30)
    producer.close()

    config = ingest_config(pg_url, kafka_bootstrap, topic, dead_letter_topic=dlq, batch_size=500)
    with running_ingest(config) as service:
        wait_until(lambda: caught_up(store.engine, kafka_bootstrap, topic, config.group), 60, "ingest to catch up")
        stats = dataclasses.replace(service.stats)
    with store.engine.connect() as conn:
        letters = conn.execute(sa.select(t.dead_letters).order_by(t.dead_letters.c.id)).mappings().all()
    reasons = Counter(r["reason"] for r in letters)
    assert reasons == Counter({"decode": 1, "schema_version": 1, "too_large": 1, "digest_mismatch": 1,
                               "sequence": 1, "store_error": 1}), reasons
    by_reason = {r["reason"]: r for r in letters}
    assert bytes(by_reason["decode"]["payload"]) == garbage
    assert by_reason["decode"]["source"] == f"kafka:{topic}/0@5"
    assert len(by_reason["too_large"]["payload"]) > 10_000_000
    assert "digest" in by_reason["digest_mismatch"]["message"]
    assert "gap" in by_reason["sequence"]["message"]
    assert by_reason["digest_mismatch"]["event_id"] == b[b_call].event_id
    stored = {r[0] for r in store.engine.connect().execute(sa.select(t.events.c.event_id))}
    assert {e.event_id for e in a + d} <= stored, "valid events after the poison were applied"
    with store.engine.connect() as conn:
        status = dict(conn.execute(sa.select(t.executions.c.execution_id, t.executions.c.status)).all())
    assert status[a[0].execution_id] == status[d[0].execution_id] == "success"
    assert stats.dead_letters == 6
    assert stats.retries >= 1
    consumer = KafkaConsumer(dlq, bootstrap_servers=kafka_bootstrap, auto_offset_reset="earliest",
                             consumer_timeout_ms=10_000)
    copies = [dict(r.headers) for _, r in zip(range(6), consumer, strict=False)]
    consumer.close()
    assert Counter(h["reason"].decode() for h in copies) == reasons


def _terminate_busy(admin: psycopg.Connection, app_name: str) -> int:
    """Terminates the ingest's backends that are inside a batch's transaction; returns how many.

    A batch's transaction is one that has written (PostgreSQL gave it a transaction id). Neither an idle
    pooled connection (the pool replaces it silently: pre-ping) nor one still setting itself up (the
    driver's and SQLAlchemy's first queries on a new connection) is killed: killing those tests nothing,
    and killing every new connection during its set-up would keep ingest from ever reaching a batch. A
    backend killed mid-batch makes that batch fail and be retried.
    """
    rows = admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                         " WHERE application_name = %s AND backend_xid IS NOT NULL", (app_name,)).fetchall()
    return sum(1 for (ok,) in rows if ok)


def test_database_connection_killed_during_batches(pg_url: str, postgres_url: str, kafka_bootstrap: str) -> None:
    topic = create_topic(kafka_bootstrap, 3)
    store = Store.open(pg_url)
    ledger = Ledger()
    app_name = f"sapwood-ingest-fault-{random.randrange(10**6)}"
    config = ingest_config(pg_url, kafka_bootstrap, topic, batch_size=15, application_name=app_name)
    enough = threading.Event()

    def produce() -> None:
        # keeps producing until three kills have hit batches in flight, at most 300 executions
        with KafkaTransport(kafka_bootstrap, topic=topic, on_delivery=ledger, linger_ms=2) as transport:
            for seed in range(300):
                if seed >= 12 and enough.is_set():
                    break
                for ev in small(100 + seed):
                    transport.send(ev)
                time.sleep(0.15)

    killed = 0
    u = make_url(postgres_url)
    with running_ingest(config) as service, psycopg.connect(
            host=u.host, port=u.port, user=u.username or "postgres", dbname=u.database or "postgres",
            autocommit=True) as admin:
        producer = threading.Thread(target=produce, daemon=True)
        producer.start()
        deadline = time.monotonic() + 90
        while producer.is_alive() and time.monotonic() < deadline:
            time.sleep(0.005)
            if not enough.is_set():
                killed += _terminate_busy(admin, app_name)
            if killed >= 3 and service.stats.db_errors >= 1:
                enough.set()
        producer.join(30)
        wait_until(lambda: caught_up(store.engine, kafka_bootstrap, topic, config.group), 60, "ingest to recover")
        errors = service.stats.db_errors
    assert killed >= 3, "the test should have cut the ingest's connection in a batch several times"
    assert errors >= 1
    assert not ledger.failed
    check_exactly_once(store, ledger.acked, bootstrap=kafka_bootstrap, topic=topic, group=config.group)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_restart_resumes_from_stored_offsets_and_exports_metrics(pg_url: str, kafka_bootstrap: str) -> None:
    topic = create_topic(kafka_bootstrap, 2)
    store = Store.open(pg_url)
    ledger = Ledger()
    first, second = small(7) + small(8), small(9)
    with KafkaTransport(kafka_bootstrap, topic=topic, on_delivery=ledger) as transport:
        for ev in first:
            transport.send(ev)
    config = ingest_config(pg_url, kafka_bootstrap, topic)
    with running_ingest(config) as service:
        wait_until(lambda: caught_up(store.engine, kafka_bootstrap, topic, config.group), 30, "first catch-up")
        time.sleep(1.0)  # a needless second rebalance would follow the first batch within this
        assert service.stats.rebalances == 1, "a lone member is assigned its partitions once"
    with KafkaTransport(kafka_bootstrap, topic=topic, on_delivery=ledger) as transport:
        for ev in second:
            transport.send(ev)
    port = _free_port()
    with running_ingest(dataclasses.replace(config, metrics_port=port)) as service:
        wait_until(lambda: caught_up(store.engine, kafka_bootstrap, topic, config.group), 30, "second catch-up")
        assert service.stats.events == len(second), "resumed, not re-read"
        assert service.stats.duplicates == 0, "resumed, not re-read"
        wait_until(lambda: service.lag and all(v == 0 for v in service.lag.values()), 10, "lag gauge at 0")
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        kafka_offsets = {tp.partition: service.consumer.committed(tp) for tp in service.positions}
        in_process = service.committed_offsets()
    assert f"sapwood_ingest_events_total {float(len(second))}" in text
    assert "sapwood_ingest_tokens_total" in text
    assert "sapwood_ingest_apply_seconds_bucket" in text
    assert "sapwood_ingest_rebalances_total 1.0" in text
    assert f'sapwood_ingest_lag{{partition="0",topic="{topic}"}} 0.0' in text
    check_exactly_once(store, ledger.acked, bootstrap=kafka_bootstrap, topic=topic, group=config.group)
    with store.engine.connect() as conn:
        stored = offset_store(conn).read(conn, config.group, topic)
    ends = end_offsets(kafka_bootstrap, topic)
    assert stored == {p: e for p, e in ends.items() if e > 0}
    assert {p: o for p, o in kafka_offsets.items() if o is not None} == stored, "Kafka gets a copy of the offsets"
    assert {p: o for p, o in in_process.items() if o is not None} == stored, "the service reports what it stored"
    assert set(in_process) == {0, 1}, "both partitions, one of them possibly empty (None)"
    assert count_rows(store.engine, t.consumer_offsets) == len(stored)
