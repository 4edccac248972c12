"""The ingest boundary against producers we did not write (real Kafka and PostgreSQL): streamed zstd,
decompression bombs, conflicting and identical replays; dead letters keep their key and log one line each."""

from __future__ import annotations

import copy
import dataclasses
import logging
from collections import Counter

import numpy as np
import pytest
import sqlalchemy as sa

from sapwood.ingest.poison import bomb, recompressed
from sapwood.platform import schema as t
from sapwood.platform.codec import encode
from sapwood.platform.events import ModelCall, Observation
from sapwood.platform.store import Store
from sapwood.platform.synthetic import SynthConfig, synthetic_execution
from tests.support.histories import expected_input
from tests.support.kafka_ingest import caught_up, create_topic, ingest_config, raw_producer, running_ingest, wait_until

SMALL = SynthConfig(calls=8, forks=1, fork_depth=2, segments=2, obs_min=50, obs_max=200, out_min=3, out_max=20,
                    system_tokens=300, task_tokens=10, summary_tokens=8, vocab_size=500)


def test_streamed_zstd_bombs_and_replays(pg_url: str, kafka_bootstrap: str, caplog: pytest.LogCaptureFixture) -> None:
    topic = create_topic(kafka_bootstrap, 1)
    store = Store.open(pg_url)
    writer_a = synthetic_execution(dataclasses.replace(SMALL, seed=21))
    a = writer_a.events
    b = synthetic_execution(dataclasses.replace(SMALL, seed=22)).events
    key_a, key_b = a[0].execution_id.encode(), b[0].execution_id.encode()  # type: ignore[union-attr]
    obs = next(e for e in a if isinstance(e, Observation))
    flipped = copy.copy(obs)
    flipped.token_ids = obs.token_ids.copy()
    flipped.token_ids[0] += 1
    records: list[tuple[bytes, bytes]] = [(recompressed(e, declare_size=False, frames=2), key_a) for e in a]
    records += [(bomb(256 << 20, declare_size=False), key_b),  # ~32,000:1, no content size
                (bomb(8 << 20, declare_size=True, noise_every=2500), key_b),  # ~1,000:1, declared size
                (b"not a sapwood record", key_b),
                (encode(flipped), key_a),  # conflicting replay
                (encode(obs, compress=True), key_a)]  # identical replay: a duplicate
    records += [(encode(e, compress=True), key_b) for e in b]
    producer = raw_producer(kafka_bootstrap)
    for value, key in records:
        producer.send(topic, value=value, key=key, partition=0)
    producer.flush(30)
    producer.close()

    config = ingest_config(pg_url, kafka_bootstrap, topic, batch_size=200, max_event_bytes=1_000_000)
    with caplog.at_level(logging.WARNING, logger="sapwood.ingest.deadletters"), running_ingest(config) as service:
        wait_until(lambda: caught_up(store.engine, kafka_bootstrap, topic, config.group), 60, "ingest to catch up")
        stats = dataclasses.replace(service.stats)
    with store.engine.connect() as conn:
        letters = conn.execute(sa.select(t.dead_letters).order_by(t.dead_letters.c.id)).mappings().all()
        stored = {str(r[0]) for r in conn.execute(sa.select(t.events.c.event_id))}
    assert [r["reason"] for r in letters] == ["too_large", "too_large", "decode", "conflict"]
    assert {e.event_id for e in a + b} <= stored, "streamed frames were applied; the partition kept flowing"
    assert stats.duplicates == 1
    assert stats.dead_letters == 4
    assert all(bytes(r["record_key"]) == (key_a if r["reason"] == "conflict" else key_b) for r in letters)
    assert str(letters[2]["execution_id"]) == b[0].execution_id, "an undecodable record names its key's execution"
    assert "token_ids differ" in letters[3]["message"]
    assert str(letters[3]["event_id"]) == obs.event_id
    lines = [r for r in caplog.records if r.getMessage().startswith("dead_letter ")]
    assert Counter(r.dead_letter["reason"] for r in lines) == Counter(r["reason"] for r in letters)  # type: ignore[attr-defined]
    assert all(f"source=kafka:{topic}/0@" in r.getMessage() for r in lines)
    assert f"key={b[0].execution_id}" in lines[0].getMessage()
    before = store.projection_hash()
    store.rebuild_projections()
    assert store.projection_hash() == before
    for call in (e for e in a if isinstance(e, ModelCall)):  # every input of the streamed execution, exactly
        np.testing.assert_array_equal(store.reconstruct_input(call.call_id), expected_input(writer_a, call))
