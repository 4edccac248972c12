"""Engines: the SGLang engine maps the documented HTTP format.

No real SGLang server is used (it needs a GPU): the SGLang tests run a small local HTTP
server that answers ``/generate`` in SGLang's documented response format. The local torch
engine's tests are in ``test_torch_engine.py``.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sapwood.rollout.engines import EngineError, SamplingParams, SGLangEngine


# -- SGLang engine against a local server speaking SGLang's /generate format ----------------------
class _FakeSGLang(BaseHTTPRequestHandler):
    requests: list[tuple[str, dict[str, Any]]]
    reply: Any
    status: int = 200

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append((self.path, body))
        if self.path == "/update_weights_from_disk":
            payload: Any = {"success": True, "message": "ok"}
            status = 200
        else:
            payload = type(self).reply
            status = type(self).status
        data = json.dumps(payload).encode() if not isinstance(payload, bytes) else payload
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def sglang() -> Iterator[tuple[str, type[_FakeSGLang]]]:
    handler = type("Handler", (_FakeSGLang,), {"requests": [], "reply": None, "status": 200})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()


def _response(triples: list[list[Any]], **meta: Any) -> dict[str, Any]:
    return {
        "text": "".join(str(t[2]) for t in triples),
        "meta_info": {
            "id": "abc",
            "prompt_tokens": 3,
            "completion_tokens": len(triples),
            "finish_reason": {"type": "stop", "matched": triples[-1][1]},
            "output_token_logprobs": triples,
            "e2e_latency": 0.05,
            **meta,
        },
    }


def test_sglang_request_and_response_mapping(sglang: tuple[str, type[_FakeSGLang]]) -> None:
    url, handler = sglang
    # ids and log-probs come from output_token_logprobs, never from "text" (which here disagrees)
    handler.reply = _response([[-0.25, 17, "a"], [-1.5, 4242, "bc"], [-0.0, 2, None]], weight_version="7")
    engine = SGLangEngine(url)
    gen = engine.generate([5, 6, 7], SamplingParams(temperature=0.8, top_p=0.95, max_new_tokens=8,
                                                    stop_token_ids=(2,)))
    path, body = handler.requests[-1]
    assert path == "/generate"
    assert body["input_ids"] == [5, 6, 7]
    assert body["return_logprob"] is True
    assert body["stream"] is False
    assert body["sampling_params"] == {"temperature": 0.8, "top_p": 0.95, "max_new_tokens": 8, "stop_token_ids": [2]}
    assert gen.output_ids.tolist() == [17, 4242, 2]
    np.testing.assert_allclose(gen.logprobs, [-0.25, -1.5, 0.0])
    assert gen.output_ids.dtype == np.int32
    assert gen.logprobs.dtype == np.float32
    assert gen.finish_reason == "stop"
    assert gen.policy_version == 7
    assert gen.timings["server_latency_s"] == pytest.approx(0.05)
    engine.close()


def test_sglang_version_falls_back_to_the_pushed_one(sglang: tuple[str, type[_FakeSGLang]], tmp_path: Path) -> None:
    url, handler = sglang
    handler.reply = [_response([[-0.1, 9, "x"]], weight_version="default")]  # batch-shaped answer, non-int version
    published = (4, str(tmp_path / "policy-v4"))
    engine = SGLangEngine(url, latest=lambda: published, refresh_interval_s=0.0)
    gen = engine.generate([1], SamplingParams(max_new_tokens=1))
    assert handler.requests[0] == ("/update_weights_from_disk", {"model_path": published[1], "weight_version": "4"})
    assert gen.policy_version == 4
    assert gen.output_ids.tolist() == [9]
    engine.generate([1], SamplingParams(max_new_tokens=1))
    assert [p for p, _ in handler.requests].count("/update_weights_from_disk") == 1  # not newer: no reload


@pytest.mark.parametrize(
    ("reply", "status", "match"),
    [
        ({"error": "boom"}, 500, "HTTP 500"),
        ({"text": "hi"}, 200, "meta_info"),
        ({"meta_info": {"output_token_logprobs": []}}, 200, "output_token_logprobs"),
        ({"meta_info": {"output_token_logprobs": [[None, 3, "x"]]}}, 200, r"\[logprob, token_id, text\]"),
        (b"not json", 200, "not JSON"),
    ],
)
def test_sglang_errors_are_engine_errors(sglang: tuple[str, type[_FakeSGLang]], reply: Any, status: int,
                                         match: str) -> None:
    url, handler = sglang
    handler.reply, handler.status = reply, status
    with pytest.raises(EngineError, match=match):
        SGLangEngine(url).generate([1, 2], SamplingParams(max_new_tokens=2))


def test_sglang_unreachable_server_is_an_engine_error() -> None:
    engine = SGLangEngine("http://127.0.0.1:9", timeout_s=2.0)
    with pytest.raises(EngineError, match="request failed"):
        engine.generate([1], SamplingParams(max_new_tokens=1))
