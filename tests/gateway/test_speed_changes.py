"""The gateway's speed changes (docs/gateway.md, Benchmark), each checked so that undoing it fails a test:
the GIL switch interval of the gateway's process, the upstream pool's size and keep-alive expiry, the
recorder's ``after=`` check (no tree search per chained call), recording on the event loop, stripping
that copies only the dicts it changes (and never mutates the upstream's answer)."""

from __future__ import annotations

import asyncio
import copy
import sys
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from sapwood.gateway import cli
from sapwood.gateway.app import Gateway, GatewayConfig, create_app
from sapwood.gateway.openai_format import client_answer
from sapwood.platform.events import Event
from sapwood.platform.writer import ExecutionWriter
from sapwood.rollout.transports import Transport
from tests.support.stub_upstream import stub_app


class _Drop(Transport):
    def send(self, event: Event) -> None:
        self._delivered(event, None)


def test_the_gateway_process_runs_with_a_half_millisecond_switch_interval(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import uvicorn

    seen: list[float] = []
    monkeypatch.setattr(uvicorn, "run", lambda *a, **k: seen.append(sys.getswitchinterval()))
    before = sys.getswitchinterval()
    try:
        cli.gateway(upstream=["http://127.0.0.1:9"], database_url=f"sqlite:///{tmp_path / 'gw.db'}",
                    bootstrap=None, no_journal=True, upstream_model_dir=None, max_ingest_lag=None,
                    ingest_group=None)
    finally:
        sys.setswitchinterval(before)
    assert seen == [pytest.approx(0.0005)]


def test_the_upstream_pool_keeps_1024_connections_and_drops_idle_ones_after_2_s() -> None:
    config = GatewayConfig(upstreams=["http://127.0.0.1:9"])
    assert (config.upstream_connections, config.upstream_keepalive_s) == (1024, 2.0)
    app = create_app(config, _Drop())
    pool: Any = app.state.upstream_client._transport._pool
    assert pool._max_connections == 1024
    assert pool._max_keepalive_connections == 1024
    assert pool._keepalive_expiry == 2.0


def test_a_chained_call_names_its_parent_instead_of_searching_the_tree(monkeypatch: pytest.MonkeyPatch) -> None:
    searches: list[int] = []
    search = ExecutionWriter.longest_prefix_node
    monkeypatch.setattr(ExecutionWriter, "longest_prefix_node",
                        lambda self, ids: searches.append(len(ids)) or search(self, ids))
    up = stub_app()
    import httpx

    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=up), base_url="http://stub")
    app = create_app(GatewayConfig(upstreams=["http://stub"], run_id="chain"), _Drop(), client=http)
    with TestClient(app) as client:
        prompt = [7, 8, 9]
        for _ in range(30):
            r = client.post("/s/c/v1/completions", json={"prompt": prompt, "max_tokens": 3, "return_token_ids": True})
            assert r.headers["X-Sapwood-Placement"] in ("root", "next"), r.headers
            choice = r.json()["choices"][0]
            prompt = [*choice["prompt_token_ids"], *choice["token_ids"], 3]
    assert len(searches) <= 1, f"{len(searches)} prefix searches for 30 chained calls (only the root may search)"


def test_calls_are_recorded_on_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    on_loop: list[bool] = []
    record = Gateway.record

    def spy(self: Gateway, *a: Any, **k: Any) -> Any:
        try:
            asyncio.get_running_loop()
            on_loop.append(True)
        except RuntimeError:  # a worker thread (asyncio.to_thread) has no running loop
            on_loop.append(False)
        return record(self, *a, **k)

    monkeypatch.setattr(Gateway, "record", spy)
    import httpx

    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=stub_app()), base_url="http://stub")
    app = create_app(GatewayConfig(upstreams=["http://stub"], run_id="loop"), _Drop(), client=http)
    with TestClient(app) as client:
        assert client.post("/s/l/v1/completions", json={"prompt": [1, 2], "max_tokens": 2}).status_code == 200
    assert on_loop == [True]


def test_stripping_copies_only_the_dicts_it_changes_and_leaves_the_answer_alone() -> None:
    answer = {"id": "x", "usage": {"prompt_tokens": 3}, "prompt_token_ids": [1, 2, 3],
              "choices": [{"index": 0, "text": "ab", "token_ids": [5, 6], "prompt_token_ids": [1, 2, 3],
                           "logprobs": {"token_logprobs": [-0.5, -0.25]}}]}
    untouched = copy.deepcopy(answer)
    kept_lp = client_answer("completions", {"logprobs": 1}, answer)
    assert answer == untouched, "the upstream's answer (still recorded from) is not mutated"
    assert "token_ids" not in kept_lp["choices"][0]
    assert kept_lp["usage"] is answer["usage"], "unchanged parts are shared, not deep-copied"
    assert kept_lp["choices"][0]["logprobs"] is answer["choices"][0]["logprobs"]
    dropped = client_answer("completions", {}, answer)
    assert dropped["choices"][0]["logprobs"] is None
    assert answer == untouched
