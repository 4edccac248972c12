"""A kept-alive upstream connection closed as the gateway reuses it (the bench's unexplained 502).

Against a real socket server (``tests/support/resetting_upstream.py``) that resets a connection when a
second request arrives on it: with one upstream, the gateway retries the call on another connection
instead of answering 502; when every try fails, the 502 names the exception type (httpx's text is empty).
"""

from __future__ import annotations

from fastapi.testclient import TestClient

from sapwood.gateway.app import GatewayConfig, create_app
from sapwood.platform.store import Store
from sapwood.rollout.transports import InProcessTransport
from tests.support.resetting_upstream import ResettingUpstream


def test_a_reused_connection_reset_by_the_upstream_is_retried_on_a_fresh_one(
    recording: tuple[Store, InProcessTransport],
) -> None:
    store, transport = recording
    with ResettingUpstream() as upstream:
        app = create_app(GatewayConfig(upstreams=[upstream.url], run_id="reset", ack="durable"), transport)
        with TestClient(app) as client:
            prompt = [4, 5, 6]
            for _ in range(3):  # calls 2 and 3 reuse the kept-alive connection, which the upstream resets
                r = client.post("/s/a/v1/completions", json={"prompt": prompt, "max_tokens": 2})
                assert r.status_code == 200, r.text
                prompt = [*prompt, 5, 6, 7]
            metrics = client.get("/metrics").text
        resets = upstream.reset  # also the start's GET /v1/models opened a connection that a POST reuses
        assert resets >= 2
    assert f'sapwood_gateway_upstream_retries_total{{reason="connection"}} {float(resets)}' in metrics
    assert store.stats()["calls"] == 3


def test_the_502_after_the_last_try_names_the_exception_type(
    recording: tuple[Store, InProcessTransport],
) -> None:
    store, transport = recording
    with ResettingUpstream(reset_every=True) as upstream:
        app = create_app(GatewayConfig(upstreams=[upstream.url], run_id="reset", max_attempts=2), transport)
        with TestClient(app) as client:
            r = client.post("/s/a/v1/completions", json={"prompt": [1, 2], "max_tokens": 2})
        assert upstream.reset >= 2, "two attempts on the one upstream"
    assert r.status_code == 502
    message = r.json()["error"]["message"]
    assert message.startswith(f"upstream {upstream.url}/v1/completions unreachable after 2 attempt(s): ")
    assert "ReadError" in message or "RemoteProtocolError" in message, message
    assert store.stats()["calls"] == 0
