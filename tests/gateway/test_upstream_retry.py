"""Upstream 5xx or connection error before any byte reached the client: retried on the next upstream."""

from __future__ import annotations

import httpx
import pytest
from fastapi.testclient import TestClient

from sapwood.gateway.app import GatewayConfig, create_app, upstream_order
from sapwood.platform.store import Store
from sapwood.rollout.transports import InProcessTransport
from tests.support.stub_upstream import stub_app

UPSTREAMS = ["http://bad", "http://good"]


def _session_pinned_to(url: str) -> str:
    return next(f"s{k}" for k in range(100) if upstream_order(UPSTREAMS, f"s{k}")[0] == url)


@pytest.mark.parametrize("failure", ["status", "connection"])
@pytest.mark.parametrize("stream", [False, True])
def test_failing_upstream_is_retried_on_the_next_with_the_same_body(
    recording: tuple[Store, InProcessTransport], failure: str, stream: bool
) -> None:
    store, transport = recording
    bad, good = stub_app(fail_status=503), stub_app()
    mounts: dict[str, httpx.AsyncBaseTransport] = {"http://good": httpx.ASGITransport(app=good)}
    if failure == "status":
        mounts["http://bad"] = httpx.ASGITransport(app=bad)
    else:  # nothing listens there
        mounts["http://bad"] = httpx.AsyncHTTPTransport(retries=0)
    ups = UPSTREAMS if failure == "status" else ["http://127.0.0.1:9", "http://good"]
    http = httpx.AsyncClient(mounts=mounts)
    config = GatewayConfig(upstreams=ups, run_id="retry", ack="durable")
    app = create_app(config, transport, client=http)
    session = _session_pinned_to("http://bad") if failure == "status" else next(
        f"s{k}" for k in range(100) if upstream_order(ups, f"s{k}")[0] == ups[0])
    body = {"prompt": [4, 5, 6], "max_tokens": 2, "stream": stream}
    with TestClient(app) as client:
        r = client.post(f"/s/{session}/v1/completions", json=body)
        assert r.status_code == 200, r.text
        metrics = client.get("/metrics").text
    assert f'sapwood_gateway_upstream_retries_total{{reason="{failure}"}} 1.0' in metrics
    assert len(good.state.requests) == 1
    if failure == "status":
        assert bad.state.requests == good.state.requests, "the retry sends the same body (same ids)"
    assert store.stats()["calls"] == 1


def test_attempts_are_bounded_and_the_last_failure_is_passed_on(
    recording: tuple[Store, InProcessTransport],
) -> None:
    store, transport = recording
    apps = [stub_app(fail_status=500) for _ in range(3)]
    ups = ["http://u0", "http://u1", "http://u2"]
    http = httpx.AsyncClient(mounts={u: httpx.ASGITransport(app=a) for u, a in zip(ups, apps, strict=True)})
    app = create_app(GatewayConfig(upstreams=ups, run_id="retry", max_attempts=2), transport, client=http)
    with TestClient(app) as client:
        r = client.post("/s/x/v1/completions", json={"prompt": [1], "max_tokens": 1})
    assert r.status_code == 500
    assert sum(len(a.state.requests) for a in apps) == 2
    assert store.stats()["calls"] == 0
