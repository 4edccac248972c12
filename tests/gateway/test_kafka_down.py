"""Kafka down, with a real broker: the gateway fails closed (429 + Retry-After) and loses nothing it answered.

The broker is the test's own (``tests.support.private_kafka``), so stopping it leaves the shared one
alone. The gateway runs ``--ack=async`` (it answers before Kafka acknowledged: the mode that can lose
answered calls), with a Kafka delivery timeout shorter than the outage, so the producer gives events
back while the broker is down and the gateway must send them again. Once the broker is back, the real
ingest service reads the topic into PostgreSQL: every answered call is stored exactly once.
"""

from __future__ import annotations

import uuid
from collections import Counter
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from sapwood.gateway.app import GatewayConfig, create_app
from sapwood.platform.store import Store
from sapwood.rollout.transports import KafkaTransport
from tests.support.kafka_ingest import caught_up, create_topic, ingest_config, running_ingest, wait_until
from tests.support.private_kafka import private_broker
from tests.support.stub_upstream import stub_app

pytestmark = pytest.mark.kafka


def _stored_call_ids(store: Store) -> Counter[str]:
    with store.engine.connect() as conn:
        return Counter(str(uuid.UUID(str(r[0]))) for r in conn.exec_driver_sql("SELECT call_id FROM calls"))


def test_kafka_down_answers_429_and_every_answered_call_is_stored_once_it_returns(
    tmp_path: Path, pg_url: str
) -> None:
    with private_broker(tmp_path / "kafka") as broker:
        topic = create_topic(broker.bootstrap, 1, prefix="test-gateway-down")
        transport = KafkaTransport(broker.bootstrap, topic=topic, delivery_timeout_s=6.0)
        upstream = stub_app()
        config = GatewayConfig(upstreams=["http://stub"], run_id="kafka-down", ack="async", retry_after_s=2,
                               transport_timeout_s=1.0, drain_timeout_s=60)
        app = create_app(config, transport, client=httpx.AsyncClient(transport=httpx.ASGITransport(app=upstream)))
        recorder = app.state.gateway.recorder
        answered: list[str] = []

        def call(k: int) -> httpx.Response:
            return client.post(f"/s/down{k % 2}/v1/completions", json={"prompt": [7, 8, k + 9], "max_tokens": 2})

        with TestClient(app) as client:
            for k in range(3):
                r = call(k)
                assert r.status_code == 200, r.text
                answered.append(r.headers["x-sapwood-call-id"])
            assert recorder.wait_until("idle", 30)

            broker.stop()
            r = call(3)  # admitted before the outage is known: answered, its events queued
            assert r.status_code == 200, r.text
            answered.append(r.headers["x-sapwood-call-id"])
            assert recorder.wait_until("failing", 30), "the gateway never noticed the broker is down"
            assert recorder.redelivered == 0, "noticed by its flush timeout, before Kafka gave events back"
            reached = len(upstream.state.requests)
            refused = call(4)
            assert refused.status_code == 429
            assert refused.headers["retry-after"] == "2"
            assert "transport unavailable" in refused.json()["error"]["message"]
            assert len(upstream.state.requests) == reached, "a refused call must not reach the upstream"
            assert client.get("/health").json()["status"] == "recording_unavailable"
            # the producer gives the queued events back after its delivery timeout: they must be kept
            assert recorder.wait_until("gave_back", 30), "the outage did not outlast Kafka's delivery timeout"

            broker.start()
            assert recorder.wait_until("healthy", 60), "the gateway did not recover once the broker returned"
            assert recorder.wait_until("idle", 60)
            r = call(5)
            assert r.status_code == 200, r.text
            answered.append(r.headers["x-sapwood-call-id"])
            metrics = client.get("/metrics").text
        assert 'sapwood_gateway_refused_calls_total{reason="transport_unavailable"} 1.0' in metrics
        transport.close(30)

        store = Store.open(pg_url)
        config_in = ingest_config(pg_url, broker.bootstrap, topic)
        with running_ingest(config_in):
            wait_until(lambda: caught_up(store.engine, broker.bootstrap, topic, config_in.group), 60,
                       "ingest to read the whole topic")
        stored = _stored_call_ids(store)
        assert set(stored) == set(answered), "an answered call is missing, or a refused one was stored"
        assert set(stored.values()) == {1}
        with store.engine.connect() as conn:
            assert conn.execute(sa.text("SELECT count(*) FROM dead_letters")).scalar_one() == 0
        store.close()
