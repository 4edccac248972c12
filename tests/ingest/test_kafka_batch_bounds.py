"""Kafka's own batch compression is bounded too: a zstd or gzip record batch that inflates past
``max_batch_bytes`` is dead-lettered as ``too_large`` offset by offset, and the partition keeps flowing."""

from __future__ import annotations

import pytest

from sapwood.platform.store import Store
from tests.support.histories import small_execution
from tests.support.kafka_ingest import (
    create_topic,
    dead_letters_and_stored,
    ingest_until_caught_up,
    produce,
    produce_events,
)


@pytest.mark.parametrize("codec", ["zstd", "gzip"])
def test_a_batch_bomb_is_too_large_and_the_partition_keeps_flowing(pg_url: str, kafka_bootstrap: str,
                                                                   codec: str) -> None:
    topic = create_topic(kafka_bootstrap, 1)
    store = Store.open(pg_url)
    bombs = [(bytes(16 << 20), b"bomb")] * 2  # two records of 16 MiB of zeros in one batch of a few KB
    produce(kafka_bootstrap, topic, bombs, partition=0, compression_type=codec, max_request_size=40 << 20,
            linger_ms=50)
    events = small_execution(31).events
    produce_events(kafka_bootstrap, topic, events)
    ingest_until_caught_up(store, pg_url, kafka_bootstrap, topic, max_batch_bytes=4 << 20)
    letters, stored = dead_letters_and_stored(store.engine, "reason", "message", "source", "record_key", "payload")
    assert [r.reason for r in letters] == ["too_large", "too_large"]
    assert all(f"{codec} record batch" in r.message and "max_batch_bytes=4,194,304" in r.message for r in letters)
    assert {r.source for r in letters} == {f"kafka:{topic}/0@0", f"kafka:{topic}/0@1"}
    assert {e.event_id for e in events} <= stored
    assert [r.record_key for r in letters] == [b"bomb", b"bomb"], "the record key read within the bound"
    # a bounded prefix of the value: max_event_bytes (default 1,000,000) of the 16 MiB of zeros
    assert [bytes(r.payload) for r in letters] == [bytes(1_000_000)] * 2
