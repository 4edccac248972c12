"""Ack modes: ``async`` answers before the commit, ``durable`` only after the transport acknowledged the call."""

from __future__ import annotations

import threading
import uuid
import warnings
from collections import Counter
from pathlib import Path

import httpx
from fastapi.testclient import TestClient

from sapwood.gateway.app import GatewayConfig, create_app
from sapwood.platform.codec import decode
from sapwood.platform.events import Event, ModelCall
from sapwood.platform.store import Store
from sapwood.rollout.transports import KafkaTransport
from tests.support.gateway_transports import HeldTransport, released
from tests.support.kafka_ingest import create_topic
from tests.support.live_server import serve_in_thread
from tests.support.stub_upstream import stub_app


def _stub_client() -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=stub_app()))


def _stored_call_ids(store: Store) -> list[str]:
    with store.transaction() as conn:
        return [str(uuid.UUID(str(r[0]))) for r in conn.exec_driver_sql("SELECT call_id FROM calls")]


def test_async_answers_before_the_commit_and_stores_every_call_once_at_shutdown(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path / 'gw.db'}")
    transport = HeldTransport(store)
    transport.gate.clear()
    config = GatewayConfig(upstreams=["http://stub"], run_id="ack-async", ack="async", batch_size=8,
                           drain_timeout_s=10)
    app = create_app(config, transport, client=_stub_client())
    answered: list[str] = []
    with TestClient(app) as client, released(transport):
        for k in range(20):  # more than one batch, two sessions
            r = client.post(f"/s/a{k % 2}/v1/completions", json={"prompt": [3, 4, k + 5], "max_tokens": 2})
            assert r.status_code == 200, r.text
            answered.append(r.headers["x-sapwood-call-id"])
        assert transport.reached.wait(30)
        assert _stored_call_ids(store) == [], "async answers must not wait for the commit"
        transport.gate.set()
    # the app's shutdown drained the recorder's queue into the store
    stored = Counter(_stored_call_ids(store))
    assert set(stored) == set(answered)
    assert set(stored.values()) == {1}
    assert len(stored) == 20
    lags = list(app.state.gateway.recorder.lags)
    assert len(lags) == 22  # 2 executions started + 20 calls, each timed from enqueue to commit
    transport.close()
    store.close()


def test_durable_answers_only_after_the_call_is_committed(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path / 'gw.db'}")
    transport = HeldTransport(store)
    transport.gate.clear()
    log = transport.log
    answered = threading.Event()
    config = GatewayConfig(upstreams=["http://stub"], run_id="ack-durable", ack="durable", drain_timeout_s=10)
    with serve_in_thread(create_app(config, transport, client=_stub_client())) as url, released(transport):
        result: dict[str, httpx.Response] = {}

        def call() -> None:
            result["r"] = httpx.post(f"{url}/s/d/v1/completions", json={"prompt": [1, 2], "max_tokens": 2}, timeout=60)
            log.append("answer")
            answered.set()

        thread = threading.Thread(target=call)
        thread.start()
        assert transport.reached.wait(30)
        # an answer that did not wait for the commit would arrive now, while the transport is blocked
        answered.wait(1.0)
        transport.gate.set()
        thread.join(60)
    assert log == ["commit", "answer"]
    assert result["r"].status_code == 200
    assert _stored_call_ids(store) == [result["r"].headers["x-sapwood-call-id"]]
    transport.close()
    store.close()


def test_durable_call_not_acknowledged_in_time_is_a_429_and_is_still_stored_once(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path / 'gw.db'}")
    transport = HeldTransport(store)
    transport.gate.clear()
    config = GatewayConfig(upstreams=["http://stub"], run_id="ack-late", ack="durable", durable_timeout_s=0.05,
                           drain_timeout_s=10)
    with TestClient(create_app(config, transport, client=_stub_client())) as client, released(transport):
        r = client.post("/s/late/v1/completions", json={"prompt": [1, 2], "max_tokens": 2})
        assert r.status_code == 429
        assert r.headers["retry-after"] == "1"
        assert "not acknowledged" in r.json()["error"]["message"]
        transport.gate.set()
    assert len(_stored_call_ids(store)) == 1
    transport.close()
    store.close()


def test_durable_over_kafka_answers_after_acks_all(kafka_bootstrap: str) -> None:
    topic = create_topic(kafka_bootstrap, 1, prefix="test-gateway")
    acked: list[str] = []

    def on_delivery(event: Event, error: BaseException | None) -> None:
        if error is None and isinstance(event, ModelCall):
            acked.append(event.call_id)

    transport = KafkaTransport(kafka_bootstrap, topic=topic, on_delivery=on_delivery)
    config = GatewayConfig(upstreams=["http://stub"], run_id="ack-kafka", ack="durable")
    seen_at_answer: list[list[str]] = []
    call_ids = []
    with TestClient(create_app(config, transport, client=_stub_client())) as client:
        for k in range(3):
            r = client.post("/s/k/v1/completions", json={"prompt": [1, 2, k + 3], "max_tokens": 2})
            assert r.status_code == 200, r.text
            seen_at_answer.append(list(acked))
            call_ids.append(r.headers["x-sapwood-call-id"])
    for k, call_id in enumerate(call_ids):
        assert call_id in seen_at_answer[k], "answered before Kafka acknowledged the call's event"
    transport.close()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from kafka import KafkaConsumer
    consumer = KafkaConsumer(topic, bootstrap_servers=kafka_bootstrap, auto_offset_reset="earliest",
                             enable_auto_commit=False, consumer_timeout_ms=20_000)
    try:
        events = []
        for record in consumer:
            events.append(decode(record.value))
            if len(events) == 4:  # execution started + 3 calls
                break
    finally:
        consumer.close()
    assert sorted(e.call_id for e in events if isinstance(e, ModelCall)) == sorted(call_ids)
