"""Every Kafka batch codec a producer may use (gzip, snappy, lz4, zstd) is decoded by the base install:
events produced with each through a real broker are all applied, with no dead letter."""

from __future__ import annotations

import pytest

from sapwood.platform.store import Store
from tests.support.histories import small_execution
from tests.support.kafka_ingest import create_topic, dead_letters_and_stored, ingest_until_caught_up, produce_events

CODECS = ("gzip", "snappy", "lz4", "zstd")


def test_the_base_install_has_every_kafka_codec() -> None:
    import kafka.codec as codec

    have = {"gzip": codec.has_gzip(), "snappy": codec.has_snappy(), "lz4": codec.has_lz4(),
            "zstd": codec.has_zstd()}
    assert have == dict.fromkeys(CODECS, True)


@pytest.mark.parametrize("compression", CODECS)
def test_events_produced_with_each_codec_are_applied(pg_url: str, kafka_bootstrap: str, compression: str) -> None:
    topic = create_topic(kafka_bootstrap, 1)
    store = Store.open(pg_url)
    events = small_execution(7).events
    produce_events(kafka_bootstrap, topic, events, compression_type=compression, linger_ms=20)
    ingest_until_caught_up(store, pg_url, kafka_bootstrap, topic)
    letters, stored = dead_letters_and_stored(store.engine, "reason", "message")
    assert letters == []
    assert {e.event_id for e in events} <= stored


def test_a_batch_no_decoder_can_read_is_dead_lettered_and_the_partition_moves_on(
    pg_url: str, kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The consumer lacks the batch's codec (as an install without lz4 would): each offset of that batch
    becomes a ``decode`` dead letter naming partition and offset, and the records after it are applied.
    Before, the same poll failed forever (a warning, then no progress on any partition)."""
    import kafka.record.default_records as records
    from kafka.errors import UnsupportedCodecError

    def missing_lz4(data: bytes) -> bytes:
        raise UnsupportedCodecError("Libraries for lz4 compression codec not found")

    topic = create_topic(kafka_bootstrap, 1)
    store = Store.open(pg_url)
    lost, kept = small_execution(11).events, small_execution(12).events
    produce_events(kafka_bootstrap, topic, lost, compression_type="lz4", linger_ms=50)
    produce_events(kafka_bootstrap, topic, kept)
    monkeypatch.setattr(records, "lz4_decode", missing_lz4)
    ingest_until_caught_up(store, pg_url, kafka_bootstrap, topic)
    letters, stored = dead_letters_and_stored(store.engine, "reason", "message", "source")
    assert {r.reason for r in letters} == {"decode"}
    assert {r.source for r in letters} == {f"kafka:{topic}/0@{offset}" for offset in range(len(lost))}
    assert all("cannot be decompressed" in r.message and "lz4 compression codec not found" in r.message
               for r in letters)
    assert {e.event_id for e in kept} <= stored
    assert not {e.event_id for e in lost} & stored
