"""Every poison of the fault campaign's catalogue gets its own dead-letter reason from real ingest."""

from __future__ import annotations

from collections import Counter

from sapwood.ingest.poison import catalogue
from sapwood.platform.store import Store
from tests.support.kafka_ingest import create_topic, dead_letters_and_stored, ingest_until_caught_up, produce


def test_each_poison_gets_its_reason_and_the_valid_events_around_it_are_applied(pg_url: str,
                                                                                kafka_bootstrap: str) -> None:
    topic = create_topic(kafka_bootstrap, 3, configs={"max.message.bytes": str(2 * 1024 * 1024)})
    store = Store.open(pg_url)
    poisons = catalogue(7)
    produce(kafka_bootstrap, topic, ((value, p.key) for p in poisons for value in p.records),
            max_request_size=2 * 1024 * 1024)
    ingest_until_caught_up(store, pg_url, kafka_bootstrap, topic)
    got, stored = dead_letters_and_stored(store.engine, "reason", "record_key")
    assert Counter(r for r, _ in got) == Counter(p.reason for p in poisons if p.reason)
    assert {bytes(k) for _, k in got} <= {p.key for p in poisons}
    assert {e for p in poisons for e in p.valid} <= stored
    assert len({p.reason for p in poisons if p.reason}) >= 12, "every reason ingest tells apart"
