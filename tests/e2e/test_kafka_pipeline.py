"""End to end: rollout workers record through Kafka, ingest materializes; exact inputs come back.

Also: the broker restarts while workers record — the producer retries and every
acknowledged event reaches the store.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import sqlalchemy as sa

from sapwood.platform import schema as t
from sapwood.platform.store import Store
from sapwood.rollout import KafkaTransport, Recorder
from tests.support.kafka_ingest import (
    Agent,
    Ledger,
    caught_up,
    check_exactly_once,
    create_topic,
    ingest_config,
    running_ingest,
    wait_until,
)


def _record_in_threads(recorder: Recorder, n_threads: int, per_thread: int, *, pause_s: float = 0.0,
                       seed: int = 0) -> Recorded:
    """Worker threads, each running ``per_thread`` executions on the shared recorder."""
    inputs: dict[str, np.ndarray] = {}
    statuses: dict[str, str] = {}
    errors: list[BaseException] = []
    lock = threading.Lock()

    def worker(k: int) -> None:
        agent = Agent(recorder, np.random.default_rng(seed + k))
        try:
            for i in range(per_thread):
                status = "timeout" if (k + i) % 3 == 2 else "success"
                ex = agent.run(f"task-{k}-{i}", status=status)
                with lock:
                    statuses[ex.execution_id] = status
                time.sleep(pause_s)
        except BaseException as exc:
            errors.append(exc)
        with lock:
            inputs.update(agent.inputs)

    threads = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(180)
        assert not th.is_alive(), "a worker thread hung"
    return inputs, statuses, errors


Recorded = tuple[dict[str, np.ndarray], dict[str, str], list[BaseException]]


def _check_store(store: Store, inputs: dict[str, np.ndarray], statuses: dict[str, str]) -> None:
    """Every call's reconstructed input is exactly what the worker recorded; statuses match."""
    for call_id, expected in inputs.items():
        got = store.reconstruct_input(call_id)
        assert np.array_equal(got, expected), f"call {call_id}: reconstructed input differs from the recorded one"
    with store.engine.connect() as conn:
        stored = dict(conn.execute(sa.select(t.executions.c.execution_id, t.executions.c.status)).all())
    assert {str(k): v for k, v in stored.items()} == statuses


def test_recorded_executions_materialize_with_exact_inputs(pg_url: str, kafka_bootstrap: str) -> None:
    topic = create_topic(kafka_bootstrap, 4)
    store = Store.open(pg_url)
    ledger = Ledger()
    config = ingest_config(pg_url, kafka_bootstrap, topic, batch_size=200)
    with running_ingest(config) as service:
        recorder = Recorder(KafkaTransport(kafka_bootstrap, topic=topic, on_delivery=ledger), run_id="e2e",
                            engine="simulated", vocab_size=1000)
        inputs, statuses, errors = _record_in_threads(recorder, n_threads=3, per_thread=2)
        recorder.close(60)
        assert not errors, errors
        wait_until(lambda: caught_up(store.engine, kafka_bootstrap, topic, config.group), 60, "ingest to catch up")
        assert service.stats.dead_letters == 0
        assert service.stats.duplicates == 0
    assert len(inputs) >= 6 * 14
    _check_store(store, inputs, statuses)
    stats = store.stats()
    assert stats["fork_points"] == 6
    assert stats["compactions"] == 6
    assert stats["executions"] == {"success": 4, "timeout": 2}
    assert stats["dedup_ratio"] > 1.5, "calls share their prefixes in the tree"
    check_exactly_once(store, ledger.acked, bootstrap=kafka_bootstrap, topic=topic, group=config.group)


def test_broker_restart_while_recording(pg_url: str, kafka_bootstrap: str) -> None:
    from tests.support.services import ServicesUnavailable, load_state, restart_kafka

    try:
        load_state()
    except ServicesUnavailable as exc:
        pytest.skip(f"the broker is not ours to restart: {exc}")
    topic = create_topic(kafka_bootstrap, 2)
    store = Store.open(pg_url)
    ledger = Ledger()
    config = ingest_config(pg_url, kafka_bootstrap, topic, batch_size=200)
    transport = KafkaTransport(kafka_bootstrap, topic=topic, on_delivery=ledger, delivery_timeout_s=120,
                               max_block_s=120)
    recorder = Recorder(transport, run_id="restart", vocab_size=1000)
    result: list[Recorded] = []

    def record() -> None:
        result.append(_record_in_threads(recorder, n_threads=2, per_thread=5, pause_s=0.4, seed=100))

    with running_ingest(config):
        writer = threading.Thread(target=record, daemon=True)
        writer.start()
        time.sleep(1.0)
        acked_before = len(ledger.acked)
        restart_kafka()
        writer.join(180)
        assert not writer.is_alive()
        recorder.flush(120)
        inputs, statuses, errors = result[0]
        assert not errors, errors
        wait_until(lambda: caught_up(store.engine, kafka_bootstrap, topic, config.group), 90,
                   "ingest to catch up after the restart")
    recorder.close(30)
    assert 0 < acked_before < len(ledger.acked), "the restart happened in the middle of the stream"
    assert not ledger.failed, ledger.failed[:3]
    _check_store(store, inputs, statuses)
    check_exactly_once(store, ledger.acked, bootstrap=kafka_bootstrap, topic=topic, group=config.group)
