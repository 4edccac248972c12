"""Back-pressure on ingest lag: past the limit calls get 429 (or pass unrecorded, counted), below it they record."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from sapwood.gateway.app import GatewayConfig, create_app
from sapwood.gateway.ingest_lag import KafkaGroupLag, LagReader
from sapwood.platform.store import Store
from sapwood.rollout.transports import InProcessTransport, KafkaTransport, MemoryTransport, Transport
from tests.support.kafka_ingest import create_topic, ingest_config, running_ingest, unique
from tests.support.stub_upstream import stub_app

BODY = {"prompt": [1, 2, 3], "max_tokens": 2}


def _app(transport: Transport, upstream: FastAPI, reader: LagReader, **kw: object) -> FastAPI:
    config = GatewayConfig(upstreams=["http://stub"], run_id="lag", lag_interval_s=0.05, drain_timeout_s=30,
                           **kw)  # type: ignore[arg-type]
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=upstream))
    return create_app(config, transport, client=client, ingest_lag=reader)


@pytest.mark.parametrize("fail_open", [False, True])
def test_lag_past_the_limit_refuses_or_forwards_unrecorded_and_below_it_records(tmp_path: Path,
                                                                                 fail_open: bool) -> None:
    store = Store.open(f"sqlite:///{tmp_path / 'gw.db'}")
    transport = InProcessTransport(store, batch_size=1)
    lag = [0]
    upstream = stub_app()
    app = _app(transport, upstream, lambda: lag[0], max_ingest_lag=100, fail_open=fail_open)
    guard = app.state.gateway.lag_guard
    with TestClient(app) as client:
        assert guard.wait_for(lambda n: n == 0, 30)
        assert client.post("/s/l/v1/completions", json=BODY).status_code == 200
        lag[0] = 100  # at the limit: still admitted
        assert guard.wait_for(lambda n: n == 100, 30)
        assert client.post("/s/l/v1/completions", json=BODY).status_code == 200
        lag[0] = 101
        assert guard.wait_for(lambda n: n == 101, 30)
        past = client.post("/s/l/v1/completions", json=BODY)
        metrics = client.get("/metrics").text
        assert client.get("/health").json()["ingest_lag"] == 101
        lag[0] = 3
        assert guard.wait_for(lambda n: n == 3, 30)
        assert client.post("/s/l/v1/completions", json=BODY).status_code == 200
    assert "sapwood_gateway_ingest_lag 101.0" in metrics
    if fail_open:
        assert past.status_code == 200
        assert "x-sapwood-call-id" not in past.headers
        assert 'sapwood_gateway_unrecorded_calls_total{reason="ingest_lag"} 1.0' in metrics
        assert len(upstream.state.requests) == 4
    else:
        assert past.status_code == 429
        assert past.headers["retry-after"] == "1"
        assert "ingest lag" in past.json()["error"]["message"]
        assert 'sapwood_gateway_refused_calls_total{reason="ingest_lag"} 1.0' in metrics
        assert len(upstream.state.requests) == 3, "a refused call must not reach the upstream"
    assert int(store.stats()["calls"]) == 3
    transport.close()
    store.close()


def test_lag_limit_needs_a_reader() -> None:
    with pytest.raises(ValueError, match="lag reader"):
        create_app(GatewayConfig(upstreams=["http://stub"], max_ingest_lag=5), MemoryTransport())


@pytest.mark.kafka
def test_consumer_group_lag_on_the_real_topic_refuses_until_ingest_catches_up(
    kafka_bootstrap: str, pg_url: str
) -> None:
    """Nothing consumes the topic, so each durable call's events add to the group's lag; once the real
    ingest service (same group) has stored them and committed its offsets, calls are admitted again."""
    topic, group = create_topic(kafka_bootstrap, 2, prefix="test-gateway-lag"), unique("g")
    transport = KafkaTransport(kafka_bootstrap, topic=topic)
    reader = KafkaGroupLag(kafka_bootstrap, topic, group)
    assert reader() == 0
    app = _app(transport, stub_app(), reader, max_ingest_lag=4, ack="durable")
    guard = app.state.gateway.lag_guard
    with TestClient(app) as client:
        for k in range(3):  # execution started + 3 calls = 4 records: at the limit
            assert client.post("/s/g/v1/completions", json={**BODY, "prompt": [1, 2, k]}).status_code == 200
        assert guard.wait_for(lambda n: n == 4, 30)
        assert client.post("/s/g/v1/completions", json={**BODY, "prompt": [1, 9]}).status_code == 200
        assert guard.wait_for(lambda n: n == 5, 30), "the 5th record is not counted in the group's lag"
        refused = client.post("/s/g/v1/completions", json=BODY)
        assert refused.status_code == 429
        assert "ingest lag" in refused.json()["error"]["message"]
        store = Store.open(pg_url)
        with running_ingest(ingest_config(pg_url, kafka_bootstrap, topic, group=group)):
            assert guard.wait_for(lambda n: n == 0, 60), "the ingest's committed offsets did not clear the lag"
            assert client.post("/s/g/v1/completions", json=BODY).status_code == 200
        metrics = client.get("/metrics").text
    assert 'sapwood_gateway_refused_calls_total{reason="ingest_lag"} 1.0' in metrics
    assert int(store.stats()["calls"]) >= 4
    transport.close()
    store.close()
