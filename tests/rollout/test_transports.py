"""Transports: the bounded buffer, and the Kafka producer against a real broker."""

from __future__ import annotations

import threading
import time
import warnings

import numpy as np
import pytest

from sapwood.platform.codec import decode, encode
from sapwood.platform.synthetic import SynthConfig, synthetic_execution
from sapwood.rollout import DeliveryError, EventTooLargeError, KafkaTransport, Recorder
from sapwood.rollout.transports import ByteBudget

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka import KafkaConsumer

from tests.support.kafka_ingest import Ledger, create_topic

SMALL = SynthConfig(calls=8, forks=1, fork_depth=1, segments=2, obs_min=5, obs_max=30, out_min=3, out_max=20,
                    system_tokens=30, task_tokens=10, summary_tokens=8, vocab_size=500)


def test_byte_budget_blocks_until_released() -> None:
    budget = ByteBudget(100)
    assert budget.acquire(60, 0.1)
    assert not budget.acquire(50, 0.05), "over budget: must time out, not grow"
    threading.Timer(0.1, budget.release, args=(60,)).start()
    t0 = time.monotonic()
    assert budget.acquire(50, 5.0)
    assert 0.05 < time.monotonic() - t0 < 4.0
    budget.release(50)
    assert budget.acquire(500, 0.01), "one oversize item passes when nothing is in flight"


def read_all(bootstrap: str, topic: str, n: int, timeout_s: float = 20) -> list[tuple[bytes, bytes]]:
    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                             enable_auto_commit=False, consumer_timeout_ms=int(timeout_s * 1000))
    out = []
    try:
        for record in consumer:
            out.append((record.key, record.value))
            if len(out) >= n:
                break
    finally:
        consumer.close()
    return out


@pytest.mark.parametrize("compression", ["auto", "codec", "none"])
def test_kafka_transport_delivers_every_event_keyed_by_execution(kafka_bootstrap: str, compression: str) -> None:
    topic = create_topic(kafka_bootstrap, 3)
    ledger = Ledger()
    second = SynthConfig(**{**SMALL.__dict__, "seed": 1})
    events = synthetic_execution(SMALL).events + synthetic_execution(second).events
    with KafkaTransport(kafka_bootstrap, topic=topic, compression=compression,  # type: ignore[arg-type]
                        on_delivery=ledger) as transport:
        for ev in events:
            transport.send(ev)
        transport.flush(30)
        assert transport.buffered_bytes == 0
    assert len(ledger.acked) == len(events)
    assert not ledger.failed
    records = read_all(kafka_bootstrap, topic, len(events))
    assert len(records) == len(events)
    by_id = {e.event_id: e for e in events}
    for key, value in records:
        ev = decode(value)
        assert key == ev.execution_id.encode()  # type: ignore[union-attr]
        assert ev.seq == by_id[ev.event_id].seq


def test_kafka_transport_applies_backpressure_and_still_delivers(kafka_bootstrap: str) -> None:
    topic = create_topic(kafka_bootstrap, 1)
    ledger = Ledger()
    events = synthetic_execution(SMALL).events
    biggest = max(len(encode(e)) for e in events)
    with KafkaTransport(kafka_bootstrap, topic=topic, max_buffer_bytes=2 * biggest, max_event_bytes=biggest,
                        linger_ms=50, on_delivery=ledger) as transport:
        peak = 0
        for ev in events:
            transport.send(ev)
            peak = max(peak, transport.buffered_bytes)
        assert peak <= 2 * biggest
    assert len(ledger.acked) == len(events)


def test_oversize_event_is_refused_before_sending(kafka_bootstrap: str) -> None:
    topic = create_topic(kafka_bootstrap, 1)
    with KafkaTransport(kafka_bootstrap, topic=topic, max_event_bytes=200_000) as transport:
        rec = Recorder(transport, run_id="r")
        ex = rec.start("t", prompt=np.arange(10, dtype=np.int32))
        with pytest.raises(EventTooLargeError, match="exceed"):
            ex.call(np.arange(20, dtype=np.int32), np.zeros(40_000, np.int32), np.zeros(40_000, np.float32))
        big = ex.prompt(np.arange(150_000, dtype=np.int32))  # split into events under the limit
        assert big.token_ids.size < 150_000
        ev = synthetic_execution(SMALL).events[0]
        ev.metadata = {"blob": "x" * 300_000}  # type: ignore[attr-defined]
        with pytest.raises(EventTooLargeError, match="max_event_bytes"):
            transport.send(ev)


def test_broker_refusal_is_raised_as_delivery_error(kafka_bootstrap: str) -> None:
    topic = create_topic(kafka_bootstrap, 1, configs={"max.message.bytes": "2000"})
    ledger = Ledger()
    transport = KafkaTransport(kafka_bootstrap, topic=topic, compression="none", on_delivery=ledger,
                               delivery_timeout_s=15)
    rec = Recorder(transport, run_id="r")
    ex = rec.start("t")  # small: accepted
    ex.prompt(np.arange(1000, dtype=np.int32))  # ~4 KB: the topic refuses it
    with pytest.raises(DeliveryError, match="prompt") as info:
        transport.close(30)
    assert len(info.value.failures) == 1
    assert len(ledger.failed) == 1
    assert len(ledger.acked) == 1
    assert rec.broken(ex.execution_id) is None  # the recorder learns only when it flushes or sends again
