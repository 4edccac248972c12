"""Kafka's own batch compression is bounded too: a zstd or gzip record batch that inflates past
``max_batch_bytes`` is dead-lettered as ``too_large`` offset by offset, and the partition keeps flowing."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from ingest.ingest_helpers import caught_up, create_topic, ingest_config, raw_producer, running_ingest, wait_until
from sapwood.platform import schema as t
from sapwood.platform.codec import encode
from sapwood.platform.store import Store
from support.histories import small_execution


@pytest.mark.parametrize("codec", ["zstd", "gzip"])
def test_a_batch_bomb_is_too_large_and_the_partition_keeps_flowing(pg_url: str, kafka_bootstrap: str,
                                                                   codec: str) -> None:
    topic = create_topic(kafka_bootstrap, 1)
    store = Store.open(pg_url)
    bomber = raw_producer(kafka_bootstrap, compression_type=codec, max_request_size=40 << 20, linger_ms=50)
    for _ in range(2):  # two records of 16 MiB of zeros in one batch of a few KB
        bomber.send(topic, value=bytes(16 << 20), key=b"bomb", partition=0)
    bomber.flush(60)
    bomber.close()
    events = small_execution(31).events
    plain = raw_producer(kafka_bootstrap)
    for ev in events:
        plain.send(topic, value=encode(ev), key=ev.execution_id.encode(), partition=0)  # type: ignore[union-attr]
    plain.flush(30)
    plain.close()
    config = ingest_config(pg_url, kafka_bootstrap, topic, max_batch_bytes=4 << 20)
    with running_ingest(config):
        wait_until(lambda: caught_up(store.engine, kafka_bootstrap, topic, config.group), 60, "ingest to catch up")
    with store.engine.connect() as conn:
        letters = conn.execute(sa.select(t.dead_letters.c.reason, t.dead_letters.c.message,
                                         t.dead_letters.c.source)).all()
        stored = {str(r[0]) for r in conn.execute(sa.select(t.events.c.event_id))}
    assert [r.reason for r in letters] == ["too_large", "too_large"]
    assert all(f"{codec} record batch" in r.message and "max_batch_bytes=4,194,304" in r.message for r in letters)
    assert {r.source for r in letters} == {f"kafka:{topic}/0@0", f"kafka:{topic}/0@1"}
    assert {e.event_id for e in events} <= stored
