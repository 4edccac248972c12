"""Every poison of the fault campaign's catalogue gets its own dead-letter reason from real ingest."""

from __future__ import annotations

from collections import Counter

import sqlalchemy as sa

from ingest.ingest_helpers import caught_up, create_topic, ingest_config, raw_producer, running_ingest, wait_until
from sapwood.ingest.poison import catalogue
from sapwood.platform import schema as t
from sapwood.platform.store import Store


def test_each_poison_gets_its_reason_and_the_valid_events_around_it_are_applied(pg_url: str,
                                                                                kafka_bootstrap: str) -> None:
    topic = create_topic(kafka_bootstrap, 3, configs={"max.message.bytes": str(2 * 1024 * 1024)})
    store = Store.open(pg_url)
    poisons = catalogue(7)
    producer = raw_producer(kafka_bootstrap, max_request_size=2 * 1024 * 1024)
    for p in poisons:
        for value in p.records:
            producer.send(topic, value=value, key=p.key)
    producer.flush(30)
    producer.close()
    config = ingest_config(pg_url, kafka_bootstrap, topic)
    with running_ingest(config):
        wait_until(lambda: caught_up(store.engine, kafka_bootstrap, topic, config.group), 60, "ingest to catch up")
    with store.engine.connect() as conn:
        got = conn.execute(sa.select(t.dead_letters.c.reason, t.dead_letters.c.record_key)).all()
        stored = {str(r[0]) for r in conn.execute(sa.select(t.events.c.event_id))}
    assert Counter(r for r, _ in got) == Counter(p.reason for p in poisons if p.reason)
    assert {bytes(k) for _, k in got} <= {p.key for p in poisons}
    assert {e for p in poisons for e in p.valid} <= stored
    assert len({p.reason for p in poisons if p.reason}) >= 12, "every reason ingest tells apart"
