"""Back-pressure: while the transport fails or the backlog is full, calls get 429 (or pass unrecorded)."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx
from fastapi import FastAPI
from fastapi.testclient import TestClient

from sapwood.gateway.app import GatewayConfig, create_app
from sapwood.platform.store import Store
from sapwood.rollout.transports import InProcessTransport
from tests.support.gateway_transports import HeldTransport, released
from tests.support.stub_upstream import stub_app


def _app(store: Store, transport: InProcessTransport, upstream: FastAPI, **kw: object) -> FastAPI:
    config = GatewayConfig(upstreams=["http://stub"], run_id="bp", drain_timeout_s=10, **kw)  # type: ignore[arg-type]
    return create_app(config, transport, client=httpx.AsyncClient(transport=httpx.ASGITransport(app=upstream)))


def _calls(store: Store) -> int:
    return int(store.stats()["calls"])


BODY = {"prompt": [1, 2, 3], "max_tokens": 2}


def test_transport_down_fails_closed_with_429_and_nothing_is_lost_once_it_returns(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path / 'gw.db'}")
    transport, upstream = HeldTransport(store), stub_app()
    app = _app(store, transport, upstream)
    gw = app.state.gateway
    with TestClient(app) as client, released(transport):
        transport.down.set()
        first = client.post("/s/b/v1/completions", json=BODY)
        assert first.status_code == 200, "admitted before the failure was known; its events stay queued"
        assert gw.recorder.wait_until("failing", 30)
        refused = client.post("/s/b/v1/completions", json=BODY)
        assert refused.status_code == 429
        assert refused.headers["retry-after"] == "1"
        assert "transport unavailable" in refused.json()["error"]["message"]
        assert len(upstream.state.requests) == 1, "a refused call must not reach the upstream"
        assert 'sapwood_gateway_refused_calls_total{reason="transport_unavailable"} 1.0' in client.get("/metrics").text
        assert client.get("/health").json()["status"] == "recording_unavailable"
        transport.down.clear()
        assert gw.recorder.wait_until("idle", 30)
        assert gw.recorder.wait_until("healthy", 30)
        assert client.post("/s/b/v1/completions", json=BODY).status_code == 200
    assert _calls(store) == 2
    transport.close()
    store.close()


def test_backlog_at_the_limit_is_refused_and_below_it_admitted(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path / 'gw.db'}")
    transport, upstream = HeldTransport(store), stub_app()
    transport.gate.clear()
    app = _app(store, transport, upstream, max_pending=3)
    with TestClient(app) as client, released(transport):
        # first call: execution started + call = 2 undelivered events (< 3): admitted
        assert client.post("/s/q/v1/completions", json=BODY).status_code == 200
        # 2 < 3: admitted again -> 3 undelivered
        assert client.post("/s/q/v1/completions", json=BODY).status_code == 200
        over = client.post("/s/q/v1/completions", json=BODY)
        assert over.status_code == 429
        assert "backlog" in over.json()["error"]["message"]
        transport.gate.set()
    assert _calls(store) == 2
    transport.close()
    store.close()


def test_fail_open_forwards_unrecorded_and_counts_it(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path / 'gw.db'}")
    transport, upstream = HeldTransport(store), stub_app()
    app = _app(store, transport, upstream, fail_open=True)
    gw = app.state.gateway
    with TestClient(app) as client, released(transport):
        transport.down.set()
        assert client.post("/s/o/v1/completions", json=BODY).status_code == 200
        assert gw.recorder.wait_until("failing", 30)
        passed = client.post("/s/o/v1/completions", json=BODY)
        assert passed.status_code == 200
        assert "x-sapwood-call-id" not in passed.headers
        assert passed.json()["choices"][0]["logprobs"] is None, "still stripped of what the client did not ask for"
        metrics = client.get("/metrics").text
        assert 'sapwood_gateway_unrecorded_calls_total{reason="transport_unavailable"} 1.0' in metrics
        assert 'outcome="unrecorded"} 1.0' in metrics
        transport.down.clear()
    assert _calls(store) == 1
    transport.close()
    store.close()


def test_shutdown_with_the_transport_still_down_fails_within_the_drain_timeout(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path / 'gw.db'}")
    transport, upstream = HeldTransport(store), stub_app()
    config = GatewayConfig(upstreams=["http://stub"], run_id="bp", drain_timeout_s=0.5)
    app = create_app(config, transport, client=httpx.AsyncClient(transport=httpx.ASGITransport(app=upstream)))
    with released(transport):
        client = TestClient(app).__enter__()
        transport.down.set()
        assert client.post("/s/d/v1/completions", json=BODY).status_code == 200  # queued, never delivered
        assert app.state.gateway.recorder.wait_until("failing", 30)
        outcome: list[BaseException] = []

        def shut_down() -> None:
            try:
                client.__exit__(None, None, None)
            except BaseException as exc:  # the lifespan's failure, surfaced here
                outcome.append(exc)

        stopper = threading.Thread(target=shut_down, daemon=True)
        stopper.start()
        stopper.join(20)
        assert not stopper.is_alive(), "shutdown hung on a transport that stays down"
    assert outcome, "shutdown must fail loudly while events are undelivered"
    assert "not delivered after 0.5 s" in str(outcome[0])
    assert app.state.gateway.recorder.wait_until("idle", 30), "released: the queued events still arrive"
    assert _calls(store) == 1
    transport.close()
    store.close()
