"""The recording proxy against an in-process stand-in upstream: what is recorded, what the client sees."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import select

from sapwood.gateway.app import GatewayConfig, create_app, pick_upstream
from sapwood.gateway.openai_format import recorded_choices
from sapwood.gateway.streaming import StreamGather
from sapwood.platform.schema import executions
from sapwood.platform.store import Store
from sapwood.rollout.transports import InProcessTransport
from tests.support.live_server import serve_in_thread
from tests.support.stub_upstream import generate, render_chat, stream_chunks, stub_app, text_ids


@dataclass
class Rig:
    client: TestClient
    store: Store
    upstream: FastAPI
    app: FastAPI


def _rig(tmp_path: Path, *, malformed: bool = False) -> Iterator[Rig]:
    """The gateway with ``ack="durable"``: each answer comes after its call is committed."""
    store = Store.open(f"sqlite:///{tmp_path / 'gw.db'}")
    transport = InProcessTransport(store, batch_size=1)
    upstream = stub_app(malformed=malformed)
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=upstream))
    app = create_app(GatewayConfig(upstreams=["http://stub"], run_id="gw-test", ack="durable"), transport, client=http)
    with TestClient(app) as client:
        yield Rig(client, store, upstream, app)
    transport.close()
    store.close()


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    yield from _rig(tmp_path)


def _status(store: Store) -> list[tuple[str, float | None]]:
    with store.transaction() as conn:
        return [(r.status, r.reward) for r in conn.execute(select(executions.c.status, executions.c.reward))]


def test_completion_with_token_ids_is_recorded_exactly_and_extras_are_stripped(rig: Rig) -> None:
    r = rig.client.post("/s/sess-1/v1/completions", json={"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 3})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["logprobs"] is None, "the client asked for no log-probs"
    assert "token_ids" not in choice
    assert "prompt_token_ids" not in choice
    sent = rig.upstream.state.requests[-1]
    assert sent["return_token_ids"] is True
    assert sent["logprobs"] == 1
    call_id = r.headers["x-sapwood-call-id"]
    out, lps, _ = generate([5, 6, 7], 3)
    assert rig.store.reconstruct_input(call_id).tolist() == [5, 6, 7]
    ids, logprobs = rig.store.call_output(call_id)
    assert ids.tolist() == out
    assert logprobs.tolist() == lps


def test_client_that_asked_for_logprobs_and_ids_keeps_them(rig: Rig) -> None:
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 2, "logprobs": 1, "return_token_ids": True}
    choice = rig.client.post("/v1/completions", json=body, headers={"X-Session-Id": "s2"}).json()["choices"][0]
    assert choice["prompt_token_ids"] == text_ids("hi")
    assert choice["logprobs"]["token_logprobs"] == [-0.25, -0.5]


def test_chat_records_rendered_prompt_ids_and_places_chain_fork_and_segment(rig: Rig) -> None:
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "task"}]
    first = rig.client.post("/s/chat/v1/chat/completions", json={"messages": msgs, "max_tokens": 4})
    assert first.headers["x-sapwood-placement"] == "root"
    reply = first.json()["choices"][0]["message"]["content"]
    assert first.json()["choices"][0]["logprobs"] is None
    assert rig.store.reconstruct_input(first.headers["x-sapwood-call-id"]).tolist() == render_chat(msgs)
    turn2 = [*msgs, {"role": "assistant", "content": reply}, {"role": "user", "content": "more"}]
    second = rig.client.post("/s/chat/v1/chat/completions", json={"messages": turn2, "max_tokens": 4})
    # the stand-in's template puts the assistant text right after the generation prompt, so the
    # previous context (prompt + output) is a prefix of the new prompt: the next call of the chain
    assert second.headers["x-sapwood-placement"] == "next"
    alt = [*msgs, {"role": "assistant", "content": reply}, {"role": "user", "content": "other"}]
    fork = rig.client.post("/s/chat/v1/chat/completions", json={"messages": alt, "max_tokens": 4, "logprobs": True})
    assert fork.headers["x-sapwood-placement"] == "fork"
    assert [c["logprob"] for c in fork.json()["choices"][0]["logprobs"]["content"]] == [-0.25, -0.5, -0.75, -1.0]
    summary = fork.json()["choices"][0]["message"]["content"]
    compacted = [{"role": "user", "content": f"summary so far {summary}"}]
    seg = rig.client.post("/s/chat/v1/chat/completions", json={"messages": compacted, "max_tokens": 2})
    assert seg.headers["x-sapwood-placement"] == "segment"
    for r in (first, second, fork, seg):
        call_id = r.headers["x-sapwood-call-id"]
        assert rig.store.call_output(call_id)[0].tolist() == text_ids(r.json()["choices"][0]["message"]["content"])


def test_finish_records_status_reward_and_partial_score(rig: Rig) -> None:
    rig.client.post("/s/fin/v1/completions", json={"prompt": [1, 2], "max_tokens": 1})
    r = rig.client.post("/v1/sessions/fin/finish", json={"status": "success", "reward": 0.5, "partial_score": 0.25})
    assert r.status_code == 200, r.text
    assert _status(rig.store) == [("success", 0.5)]
    again = rig.client.post("/v1/sessions/fin/finish", json={"status": "success"})
    assert again.status_code == 404
    assert "fin" in again.json()["error"]["message"]


def test_finish_with_unknown_status_is_a_clear_400(rig: Rig) -> None:
    rig.client.post("/s/bad/v1/completions", json={"prompt": [1], "max_tokens": 1})
    r = rig.client.post("/v1/sessions/bad/finish", json={"status": "done"})
    assert r.status_code == 400
    assert "success, error, timeout" in r.json()["error"]["message"]


def test_idle_sessions_end_as_timeout(rig: Rig) -> None:
    rig.client.post("/s/idle/v1/completions", json={"prompt": [1], "max_tokens": 1})
    gw = rig.app.state.gateway
    last = gw.sessions.open["idle"].last_seen
    assert gw.expire_idle(last + gw.config.idle_timeout_s - 0.001) == []
    assert gw.expire_idle(last + gw.config.idle_timeout_s) == ["idle"]
    gw.recorder.flush(timeout=30)
    assert _status(rig.store) == [("timeout", None)]


def test_request_without_a_session_is_refused(rig: Rig) -> None:
    r = rig.client.post("/v1/completions", json={"prompt": [1], "max_tokens": 1})
    assert r.status_code == 400
    assert "X-Session-Id" in r.json()["error"]["message"]
    assert rig.upstream.state.requests == []


def test_models_passthrough_health_and_metrics(rig: Rig) -> None:
    assert rig.client.get("/v1/models").json()["data"][0]["id"] == "tiny"
    assert rig.client.get("/s/x/v1/models").status_code == 200
    rig.client.post("/s/m/v1/completions", json={"prompt": [1], "max_tokens": 1})
    assert rig.client.get("/health").json()["open_sessions"] == 1
    metrics = rig.client.get("/metrics").text
    assert 'sapwood_gateway_calls_total{endpoint="completions",outcome="recorded"} 1.0' in metrics


def test_malformed_upstream_answer_is_a_502_and_nothing_is_recorded(tmp_path: Path) -> None:
    for rig in _rig(tmp_path, malformed=True):
        r = rig.client.post("/s/mal/v1/completions", json={"prompt": [1, 2], "max_tokens": 2})
        assert r.status_code == 502
        assert "prompt_token_ids" in r.json()["error"]["message"]
        assert 'outcome="malformed"} 1.0' in rig.client.get("/metrics").text
        assert rig.store.stats()["calls"] == 0


def test_sessions_are_pinned_to_one_upstream_and_spread_over_all() -> None:
    ups = ["http://a", "http://b", "http://c"]
    assert all(pick_upstream(ups, f"s{i}") == pick_upstream(ups, f"s{i}") for i in range(50))
    assert {pick_upstream(ups, f"s{i}") for i in range(50)} == set(ups)


def test_config_rejects_missing_or_bad_upstreams() -> None:
    with pytest.raises(ValueError, match="at least one --upstream"):
        GatewayConfig(upstreams=[])
    with pytest.raises(ValueError, match="http:// or https://"):
        GatewayConfig(upstreams=["localhost:8000"])
    assert GatewayConfig(upstreams=["http://h:1/v1/"]).upstreams == ["http://h:1"]


def _sse_chunks(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:") and "[DONE]" not in line]


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_streamed_call_passes_chunks_through_stripped_and_is_recorded_at_the_end(rig: Rig, endpoint: str) -> None:
    if endpoint == "completions":
        path, body = "/s/st/v1/completions", {"prompt": [5, 6, 7], "max_tokens": 3, "stream": True}
        prompt = [5, 6, 7]
    else:
        msgs = [{"role": "user", "content": "go"}]
        path, body = "/s/st/v1/chat/completions", {"messages": msgs, "max_tokens": 3, "stream": True}
        prompt = render_chat(msgs)
    with rig.client.stream("POST", path, json=body) as r:
        text = "".join(r.iter_text())
        assert r.status_code == 200, text
    chunks = _sse_chunks(text)
    assert len(chunks) == 4
    assert text.rstrip().endswith("data: [DONE]")
    assert all("token_ids" not in c and "prompt_token_ids" not in c for ch in chunks for c in ch["choices"])
    assert all(c.get("logprobs") is None for ch in chunks for c in ch["choices"])
    assert "prompt_token_ids" not in chunks[0]
    out, lps, _ = generate(prompt, 3)
    with rig.store.transaction() as conn:
        call_id, reason = conn.exec_driver_sql("SELECT call_id, finish_reason FROM calls").one()
    assert reason == "length"
    assert rig.store.reconstruct_input(call_id).tolist() == prompt
    ids, logprobs = rig.store.call_output(call_id)
    assert ids.tolist() == out
    assert logprobs.tolist() == lps


def test_stream_that_ends_early_records_what_arrived_as_abort(rig: Rig) -> None:
    """The gathered stream of an upstream cut after two tokens (no finish reason, no [DONE])."""
    gather = StreamGather("completions")
    chunks = _sse_chunks(
        "\n".join(
            f"data: {json.dumps(c)}"
            for c in stream_chunks(
                {
                    "choices": [
                        {
                            "text": "abc",
                            "finish_reason": "length",
                            "prompt_token_ids": [5, 6],
                            "token_ids": [1, 2, 3],
                            "logprobs": {"token_logprobs": [-1.0, -2.0, -3.0]},
                        }
                    ]
                },
                "completions",
            )
        )
    )
    for chunk in chunks[:3]:
        gather.feed(chunk)
    answer = gather.answer(aborted=True)
    (choice,) = recorded_choices("completions", answer)
    assert (choice.prompt_ids, choice.output_ids, choice.logprobs, choice.finish_reason) == (
        [5, 6],
        [1, 2],
        [-1.0, -2.0],
        "abort",
    )
    assert gather.answer(aborted=False)["choices"][0]["finish_reason"] is None


def test_client_that_disconnects_mid_stream_records_the_partial_output_as_abort(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path / 'gw.db'}")
    transport = InProcessTransport(store, batch_size=1)
    with serve_in_thread(stub_app(hang_after=3)) as upstream_url:
        app = create_app(GatewayConfig(upstreams=[upstream_url], run_id="gw-test"), transport)
        with serve_in_thread(app) as url:
            body = {"prompt": [5, 6, 7], "max_tokens": 4, "stream": True}
            with httpx.stream("POST", f"{url}/s/gone/v1/completions", json=body, timeout=30) as r:
                data: list[str] = []
                for line in r.iter_lines():
                    if line.startswith("data:"):
                        data.append(line)
                    if len(data) == 3:  # the prompt chunk + two tokens; the upstream then stalls
                        break
            calls = app.state.gateway.calls
            deadline = time.monotonic() + 30
            while calls.labels("completions", "aborted")._value.get() < 1:
                assert time.monotonic() < deadline, "the aborted stream was never recorded"
                time.sleep(0.01)
            app.state.gateway.recorder.flush(timeout=30)
    with store.transaction() as conn:
        call_id, reason = conn.exec_driver_sql("SELECT call_id, finish_reason FROM calls").one()
    assert reason == "abort"
    out, lps, _ = generate([5, 6, 7], 4)
    ids, logprobs = store.call_output(call_id)
    assert ids.tolist() == out[:2]
    assert logprobs.tolist() == lps[:2]
    transport.close()
    store.close()


def test_stripping_leaves_the_upstream_answer_untouched() -> None:
    from sapwood.gateway.openai_format import client_answer

    answer = {"prompt_token_ids": [1, 2], "choices": [{"index": 0, "token_ids": [3], "prompt_token_ids": [1, 2],
                                                       "logprobs": {"token_logprobs": [-0.5]}}]}
    before = json.dumps(answer, sort_keys=True)
    out = client_answer("completions", {"prompt": [1, 2]}, answer)
    assert out == {"choices": [{"index": 0, "logprobs": None}]}
    assert json.dumps(answer, sort_keys=True) == before, "the recorded answer must not change"


def test_next_calls_are_recorded_below_the_previous_call_and_a_fork_is_placed_by_the_search() -> None:
    from sapwood.platform.events import ModelCall
    from sapwood.rollout.transports import MemoryTransport

    transport = MemoryTransport()
    app = create_app(GatewayConfig(upstreams=["http://stub"], run_id="nodes"), transport,
                     client=httpx.AsyncClient(transport=httpx.ASGITransport(app=stub_app())))
    with TestClient(app) as client:
        prompt = [5, 6, 7]
        for _ in range(3):  # a chain
            choice = client.post("/s/n/v1/completions", json={"prompt": prompt, "max_tokens": 2,
                                                               "return_token_ids": True}).json()["choices"][0]
            prompt = [*choice["prompt_token_ids"], *choice["token_ids"], 9]
        client.post("/s/n/v1/completions", json={"prompt": [5, 6, 7, 1], "max_tokens": 2})  # a fork of call 0
    calls = [e for e in transport.events if isinstance(e, ModelCall)]
    assert [c.parent for c in calls[1:3]] == [calls[0].output_node_id, calls[1].output_node_id]
    assert calls[0].parent is None
    assert calls[3].parent not in {c.output_node_id for c in calls[:3]}, "a fork is placed by the recorder's search"


def _scores(store: Store) -> list[tuple[int, float, str]]:
    from sapwood.platform.schema import scores

    with store.transaction() as conn:
        rows = conn.execute(select(scores.c.revision, scores.c.score, scores.c.scorer).order_by(scores.c.revision))
        return [(r.revision, r.score, r.scorer) for r in rows]


def test_score_revisions_while_open_after_finish_and_after_timeout(rig: Rig) -> None:
    """Durable rig: each answer comes after its score event is committed, so the store is read at once."""
    rig.client.post("/s/sc/v1/completions", json={"prompt": [1, 2], "max_tokens": 1})
    first = rig.client.post("/v1/sessions/sc/score", json={"score": 0.25, "scorer": "tests"})
    assert first.status_code == 200, first.text
    assert first.json()["revision"] == 0
    rig.client.post("/v1/sessions/sc/finish", json={"status": "success", "reward": 1.0, "partial_score": 0.5})
    late = rig.client.post("/v1/sessions/sc/score", json={"score": 0.75, "note": "re-graded"})
    assert late.json()["revision"] == 2, late.text
    assert _scores(rig.store) == [(0, 0.25, "tests"), (1, 0.5, "default"), (2, 0.75, "default")]
    gw = rig.app.state.gateway
    rig.client.post("/s/idle2/v1/completions", json={"prompt": [3], "max_tokens": 1})
    gw.expire_idle(gw.sessions.open["idle2"].last_seen + gw.config.idle_timeout_s)
    assert rig.client.post("/v1/sessions/idle2/score", json={"score": 0.1}).status_code == 200, "timeout: scored later"


def test_bad_or_unknown_score_requests_are_refused_clearly(rig: Rig) -> None:
    missing = rig.client.post("/v1/sessions/nobody/score", json={"score": 1.0})
    assert missing.status_code == 404
    assert "nobody" in missing.json()["error"]["message"]
    rig.client.post("/s/b/v1/completions", json={"prompt": [1], "max_tokens": 1})
    for body in ({}, {"score": "high"}, {"score": float("nan")}, {"score": True}):
        r = rig.client.post("/v1/sessions/b/score", content=json.dumps(body))
        assert r.status_code == 400, (body, r.text)
