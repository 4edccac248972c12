"""A produce / consume / commit round trip through kafka-python against the real broker."""

from __future__ import annotations

import time
import uuid
import warnings

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.admin import NewTopic

MESSAGES = 6
COMMIT_AFTER = 3


def _consumer(bootstrap: str, group: str, topic: str) -> KafkaConsumer:
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        consumer_timeout_ms=1000,
    )
    consumer.subscribe([topic])
    return consumer


def _poll(consumer: KafkaConsumer, want: int, timeout_s: float = 30.0) -> list:
    records: list = []
    deadline = time.monotonic() + timeout_s
    while len(records) < want and time.monotonic() < deadline:
        batch = consumer.poll(timeout_ms=500, max_records=want - len(records))
        for part in batch.values():
            records.extend(part)
    return records


def test_produce_consume_commit_resume(kafka_bootstrap: str) -> None:
    topic = f"sapwood-ready-{uuid.uuid4().hex[:12]}"
    group = f"sapwood-ready-{uuid.uuid4().hex[:12]}"
    tp = TopicPartition(topic, 0)

    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    try:
        admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])
    finally:
        admin.close()

    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all", linger_ms=0)
    try:
        futures = [producer.send(topic, key=b"k", value=f"m{i}".encode()) for i in range(MESSAGES)]
        producer.flush(timeout=30)
        offsets = [f.get(timeout=30).offset for f in futures]
    finally:
        producer.close()
    assert offsets == list(range(MESSAGES))

    first = _consumer(kafka_bootstrap, group, topic)
    try:
        records = _poll(first, COMMIT_AFTER)
        assert [r.value for r in records] == [f"m{i}".encode() for i in range(COMMIT_AFTER)]
        assert [r.offset for r in records] == list(range(COMMIT_AFTER))
        first.commit()
        assert first.committed(tp) == COMMIT_AFTER
    finally:
        first.close()

    second = _consumer(kafka_bootstrap, group, topic)
    try:
        rest = _poll(second, MESSAGES - COMMIT_AFTER)
        assert [r.offset for r in rest] == list(range(COMMIT_AFTER, MESSAGES))
        assert [r.value for r in rest] == [f"m{i}".encode() for i in range(COMMIT_AFTER, MESSAGES)]
        end = second.end_offsets([tp])[tp]
        assert end == MESSAGES
        assert end - (second.committed(tp) or 0) == MESSAGES - COMMIT_AFTER  # lag before the next commit
    finally:
        second.close()
