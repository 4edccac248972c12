"""SGLang's native ``POST /generate`` through the gateway, against the stand-in speaking SGLang's shape."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from sapwood.gateway.app import GatewayConfig, create_app
from sapwood.gateway.sglang_format import GenerateGather, upstream_request
from sapwood.platform.store import Store
from sapwood.rollout.transports import InProcessTransport
from tests.support.stub_upstream import generate, stub_app, text_ids


def _client(tmp_path: Path, upstream: FastAPI) -> Iterator[tuple[TestClient, Store]]:
    store = Store.open(f"sqlite:///{tmp_path / 'gw.db'}")
    transport = InProcessTransport(store, batch_size=1)
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=upstream))
    app = create_app(GatewayConfig(upstreams=["http://stub"], run_id="sgl", engine="sglang", ack="durable"),
                     transport, client=http)
    with TestClient(app) as client:
        yield client, store
    transport.close()
    store.close()


@pytest.fixture
def upstream() -> FastAPI:
    return stub_app()


@pytest.fixture
def rig(tmp_path: Path, upstream: FastAPI) -> Iterator[tuple[TestClient, Store]]:
    yield from _client(tmp_path, upstream)


def test_input_ids_call_is_recorded_and_logprobs_stripped(rig: tuple[TestClient, Store], upstream: FastAPI) -> None:
    client, store = rig
    r = client.post("/s/g/generate", json={"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 3}})
    assert r.status_code == 200, r.text
    meta = r.json()["meta_info"]
    assert "output_token_logprobs" not in meta
    assert meta["finish_reason"] == {"type": "length", "length": 3}
    assert upstream.state.requests[-1]["return_logprob"] is True
    out, lps, _ = generate([5, 6, 7], 3)
    call_id = r.headers["x-sapwood-call-id"]
    assert store.reconstruct_input(call_id).tolist() == [5, 6, 7]
    ids, logprobs = store.call_output(call_id)
    assert ids.tolist() == out
    assert logprobs.tolist() == lps


def test_text_prompt_records_the_engines_prompt_ids(rig: tuple[TestClient, Store], upstream: FastAPI) -> None:
    client, store = rig
    body = {"text": "hey", "sampling_params": {"max_new_tokens": 2}, "return_logprob": True}
    r = client.post("/generate", json=body, headers={"X-Session-Id": "t"})
    assert r.status_code == 200, r.text
    assert upstream.state.requests[-1]["logprob_start_len"] == 0
    meta = r.json()["meta_info"]
    assert [e[0] for e in meta["output_token_logprobs"]] == [-0.25, -0.5], "the client asked for log-probs"
    assert "input_token_logprobs" not in meta, "only the gateway asked for the prompt's"
    assert store.reconstruct_input(r.headers["x-sapwood-call-id"]).tolist() == text_ids("hey")


def test_streamed_generate_passes_chunks_and_records_at_the_end(rig: tuple[TestClient, Store]) -> None:
    client, store = rig
    body = {"input_ids": [9, 8], "sampling_params": {"max_new_tokens": 4}, "stream": True}
    with client.stream("POST", "/s/st/generate", json=body) as r:
        text = "".join(r.iter_text())
    chunks = [json.loads(x[5:]) for x in text.splitlines() if x.startswith("data:") and "[DONE]" not in x]
    assert len(chunks) == 4
    assert all("output_token_logprobs" not in c["meta_info"] for c in chunks)
    assert text.rstrip().endswith("data: [DONE]")
    out, lps, _ = generate([9, 8], 4)
    with store.transaction() as conn:
        call_id, reason = conn.exec_driver_sql("SELECT call_id, finish_reason FROM calls").one()
    assert reason == "length"
    ids, logprobs = store.call_output(str(call_id))
    assert ids.tolist() == out
    assert logprobs.tolist() == lps


def test_gather_reads_incremental_chunks_and_marks_an_unfinished_stream_abort() -> None:
    gather = GenerateGather()
    for k in range(2):  # incremental mode: each chunk has only its new token
        gather.feed({"meta_info": {"completion_tokens": k + 1, "output_token_logprobs": [[-1.0 * k, 40 + k, None]]}})
    assert [e[1] for e in gather.output] == [40, 41]
    assert gather.answer(aborted=True)["meta_info"]["finish_reason"] == {"type": "abort"}


def test_malformed_generate_answer_is_a_502(tmp_path: Path) -> None:
    for client, store in _client(tmp_path, stub_app(malformed=True)):
        body = {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 2}}
        r = client.post("/s/m/generate", json=body)
        assert r.status_code == 502
        assert "output_token_logprobs" in r.json()["error"]["message"]
        assert store.stats()["calls"] == 0


@pytest.mark.parametrize(
    ("body", "message"),
    [({"input_ids": [[1, 2], [3]]}, "one non-empty list"), ({"input_ids": []}, "one non-empty list"),
     ({"text": ["a", "b"]}, "needs 'input_ids'"), ({}, "needs 'input_ids'")],
)
def test_batched_or_missing_prompts_are_refused_clearly(body: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        upstream_request(body)
