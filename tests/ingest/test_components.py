"""The ingest's record decoding and its sensor, without servers."""

from __future__ import annotations

import uuid

import pytest
from prometheus_client import CollectorRegistry

from sapwood.ingest.deadletters import DeadLetter
from sapwood.ingest.metrics import IngestMetrics, IngestSensor
from sapwood.ingest.record_decoder import SkippedRecord, decode_records
from sapwood.platform.apply import ApplyResult, Rejected
from sapwood.platform.codec import decode, encode
from sapwood.platform.errors import SequenceError
from sapwood.platform.events import ExecutionStarted
from tests.support.kafka_ingest import FakeRecord as Record
from tests.support.kafka_ingest import FakeTopicPartition as TP


def started() -> ExecutionStarted:
    return ExecutionStarted(run_id="r", task_id="t", execution_id=str(uuid.uuid4()), seq=0)


def test_records_exactly_at_the_limit_are_decoded_one_byte_over_are_too_large() -> None:
    data = encode(started())
    tp = TP("events", 3)
    at_limit = decode_records({tp: [Record(7, data)]}, max_event_bytes=len(data))
    assert len(at_limit.events) == 1
    assert not at_limit.letters
    assert at_limit.origin[id(at_limit.events[0])][0] == "kafka:events/3@7"
    over = decode_records({tp: [Record(7, data)]}, max_event_bytes=len(data) - 1)
    assert not over.events
    [letter] = over.letters
    assert (letter.reason, letter.source, letter.payload, letter.key) == ("too_large", "kafka:events/3@7", data,
                                                                          b"exec-key")
    assert f"max_event_bytes={len(data) - 1:,}" in letter.message


def test_undecodable_records_get_the_codecs_reason_and_keep_their_bytes() -> None:
    tp = TP("events", 0)
    good = encode(started())
    out = decode_records({tp: [Record(0, b"not sapwood"), Record(1, good), Record(2, good[:-3])]},
                         max_event_bytes=10_000)
    assert [e.event_id for e in out.events] == [started_id(good)]
    assert [(dl.reason, dl.source) for dl in out.letters] == [("decode", "kafka:events/0@0"),
                                                                ("decode", "kafka:events/0@2")]
    assert out.letters[0].payload == b"not sapwood"


def started_id(data: bytes) -> str:
    return decode(data).event_id


def test_a_poisoned_batch_dead_letters_every_record_as_given() -> None:
    tp = TP("events", 1)
    out = decode_records({tp: [SkippedRecord(5), SkippedRecord(6)]}, max_event_bytes=100,
                         poison=("too_large", "batch too large"))
    assert not out.events
    assert [(dl.reason, dl.message, dl.source, dl.payload) for dl in out.letters] == [
        ("too_large", "batch too large", "kafka:events/1@5", b""), ("too_large", "batch too large",
                                                                     "kafka:events/1@6", b"")]


def test_rejected_events_become_dead_letters_with_their_ids() -> None:
    tp = TP("events", 2)
    data = encode(started())
    out = decode_records({tp: [Record(9, data)]}, max_event_bytes=10_000)
    event = out.events[0]
    out.reject(ApplyResult(rejected=[Rejected(event, SequenceError("seq 3 after 1"))]))
    [letter] = out.letters
    assert (letter.reason, letter.source, letter.event_id, letter.execution_id, letter.payload) == (
        "sequence", "kafka:events/2@9", event.event_id, event.execution_id, data)


def sample(metrics: IngestMetrics, name: str, labels: dict[str, str] | None = None) -> float | None:
    return metrics.registry.get_sample_value(name, labels or {})


def test_the_sensor_keeps_totals_and_prometheus_in_step() -> None:
    sensor = IngestSensor(IngestMetrics(CollectorRegistry()))
    result = ApplyResult(applied=[started(), started()], duplicates=1, tokens=40)
    letters = [DeadLetter("decode", "m", b"", "s"), DeadLetter("decode", "m", b"", "s"),
               DeadLetter("too_large", "m", b"", "s")]
    sensor.batch_started()
    first = sensor.stats.first_batch_at
    sensor.batch_done(result, letters, 0.02, advanced=True)
    sensor.batch_started()
    sensor.batch_done(ApplyResult(), [], 0.5, advanced=False)  # moved no offset: not a batch
    s, m = sensor.stats, sensor.metrics
    assert s.first_batch_at == first is not None
    assert (s.events, s.tokens, s.duplicates, s.dead_letters, s.batches) == (2, 40, 1, 3, 1)
    assert sample(m, "sapwood_ingest_events_total") == 2
    assert sample(m, "sapwood_ingest_tokens_total") == 40
    assert sample(m, "sapwood_ingest_dead_letters_total", {"reason": "decode"}) == 2
    assert sample(m, "sapwood_ingest_dead_letters_total", {"reason": "too_large"}) == 1
    assert sample(m, "sapwood_ingest_batches_total") == 1
    assert sample(m, "sapwood_ingest_apply_seconds_count") == 1
    sensor.retried()
    sensor.retried(db_error=True)
    sensor.rebalanced()
    assert (s.retries, s.db_errors, s.rebalances) == (2, 1, 1)
    assert sample(m, "sapwood_ingest_retries_total") == 2
    assert sample(m, "sapwood_ingest_rebalances_total") == 1


def test_lag_is_measured_per_interval_and_forgotten_on_revoke() -> None:
    sensor = IngestSensor(IngestMetrics(CollectorRegistry()), lag_interval_s=3600)
    a, b = TP("events", 0), TP("events", 1)
    asked: list[list[TP]] = []

    def ends(tps: list[TP]) -> dict[TP, int]:
        asked.append(tps)
        return {a: 100, b: 5}

    sensor.report_lag({a: 60, b: None}, ends)
    assert sensor.lag == {0: 40, 1: 5}, "nothing stored: lag is the whole log"
    assert sample(sensor.metrics, "sapwood_ingest_lag", {"topic": "events", "partition": "0"}) == 40
    sensor.report_lag({a: 100, b: 5}, ends)
    assert len(asked) == 1, "within the interval the broker is not asked"
    assert sensor.lag == {0: 40, 1: 5}, "within the interval the broker is not asked"
    sensor.report_lag({a: 100, b: 9}, ends, force=True)
    assert sensor.lag == {0: 0, 1: 0}, "a position past the end never reads as negative lag"
    sensor.partition_revoked("events", 1)
    assert sensor.lag == {0: 0}
    assert sample(sensor.metrics, "sapwood_ingest_lag", {"topic": "events", "partition": "1"}) is None
    sensor.partition_revoked("events", 1)  # twice: no error


def test_a_failing_broker_leaves_the_last_lag() -> None:
    sensor = IngestSensor(IngestMetrics(CollectorRegistry()), lag_interval_s=0)
    sensor.lag[0] = 7

    def down(_tps: list[TP]) -> dict[TP, int]:
        raise TimeoutError("broker unreachable")

    sensor.report_lag({TP("events", 0): 1}, down)
    assert sensor.lag == {0: 7}


@pytest.mark.parametrize("bad", [0, -1])
def test_the_service_refuses_a_batch_size_below_one(bad: int) -> None:
    from sapwood.ingest import IngestConfig, IngestService

    with pytest.raises(ValueError, match=f"batch_size must be ≥ 1, got {bad}"):
        IngestService(IngestConfig(database_url="sqlite://", bootstrap="b:9092", batch_size=bad))
