"""Engines: the local torch engine agrees with the learner; the SGLang engine maps the documented HTTP format.

No real SGLang server is used (it needs a GPU): the SGLang tests run a small local HTTP
server that answers ``/generate`` in SGLang's documented response format.
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
import torch

from sapwood.learner.batch import ACTION, PROMPT, TreeBatchBuilder
from sapwood.learner.loop import latest_policy
from sapwood.learner.model import TinyActorCritic, TinyTransformerConfig, tree_forward
from sapwood.learner.source import SourceConfig, build_batch
from sapwood.platform.errors import ValidationError
from sapwood.platform.events import PolicyPublished
from sapwood.platform.store import Store
from sapwood.rollout.engines import EngineError, LocalTorchEngine, SamplingParams, SGLangEngine, load_model_state
from sapwood.rollout.recorder import Recorder
from sapwood.rollout.tasks import KeyRecallEnv
from sapwood.rollout.transports import InProcessTransport
from sapwood.rollout.worker import run_execution

CFG = TinyTransformerConfig(vocab_size=64, d_model=32, n_heads=4, n_layers=2, d_ff=64, max_position=64)


@pytest.fixture
def model() -> TinyActorCritic:
    torch.manual_seed(0)
    return TinyActorCritic(CFG).eval()


# -- local engine ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("temperature", "top_p", "mode"), [(1.0, 1.0, "sampling"), (0.7, 0.9, "model")])
def test_local_engine_logprobs_equal_learner_tree_forward(model: TinyActorCritic, temperature: float, top_p: float,
                                                          mode: str) -> None:
    engine = LocalTorchEngine(CFG, state=model.state_dict(), seed=3, logprobs=mode)  # type: ignore[arg-type]
    prompt = [1, 2, 3, 20, 21, 22, 4]
    gen = engine.generate(prompt, SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=12))
    assert gen.output_ids.dtype == np.int32 and gen.logprobs.dtype == np.float32
    assert gen.output_ids.size == gen.logprobs.size == 12 and gen.finish_reason == "length"
    b = TreeBatchBuilder()
    e = b.add_execution("x")
    end = b.add_run(e, -1, prompt, PROMPT)
    b.add_run(e, end, gen.output_ids.tolist(), ACTION, logprobs=gen.logprobs.tolist(), reward=0.0)
    batch = b.build()
    with torch.no_grad():
        out = tree_forward(model, batch)
    learner_lp = out.logprob[len(prompt):].numpy()
    torch.testing.assert_close(torch.from_numpy(learner_lp), torch.from_numpy(gen.logprobs), atol=1e-5, rtol=1e-5)


def test_local_engine_logprobs_survive_the_store_and_match_the_learner(tmp_path: Path,
                                                                      model: TinyActorCritic) -> None:
    """Engine → recorder → store → batch source → tree_forward: the logged π_rollout equals π_θ."""
    from sapwood.rollout.tasks import KeyRecallConfig

    env = KeyRecallEnv(KeyRecallConfig(fork_prob=1.0))
    cfg = TinyTransformerConfig(vocab_size=env.config.vocab_size, d_model=32, n_heads=4, n_layers=2, d_ff=64,
                                max_position=env.config.context_limit)
    torch.manual_seed(1)
    net = TinyActorCritic(cfg).eval()
    store = Store.open(f"sqlite:///{tmp_path / 's.db'}")
    recorder = Recorder(InProcessTransport(store), run_id="r", vocab_size=cfg.vocab_size)
    engine = LocalTorchEngine(cfg, state=net.state_dict(), seed=0)
    rng = np.random.default_rng(0)
    ids = [run_execution(env, engine, recorder, env.sample_task(rng), rng).execution_id for _ in range(2)]
    recorder.flush()
    batch, used = build_batch(store, ids, SourceConfig())
    assert used == ids
    with torch.no_grad():
        out = tree_forward(net, batch)
    m = batch.trainable
    assert int(m.sum()) > 20
    torch.testing.assert_close(out.logprob[m], batch.rollout_logprob[m], atol=1e-5, rtol=1e-5)


def test_stop_tokens_and_top_p(model: TinyActorCritic) -> None:
    engine = LocalTorchEngine(CFG, state=model.state_dict(), seed=0)
    with torch.no_grad():
        logits = engine.next_token_logits(torch.tensor([1, 2, 3]))
    probs = torch.softmax(logits, -1)
    top = int(probs.argmax())
    gen = engine.generate([1, 2, 3], SamplingParams(max_new_tokens=5, stop_token_ids=(top,), top_p=1e-6))
    # top-p that keeps one token is greedy; the stop token ends the call and is part of the output
    assert gen.output_ids.tolist() == [top] and gen.finish_reason == "stop"
    assert gen.logprobs[0] == pytest.approx(0.0, abs=1e-6)  # the sampled distribution had one token


def test_engine_rejects_bad_requests(model: TinyActorCritic) -> None:
    engine = LocalTorchEngine(CFG, state=model.state_dict())
    with pytest.raises(ValidationError):
        engine.generate([], SamplingParams())
    with pytest.raises(EngineError, match="max_position"):
        engine.generate([1] * 60, SamplingParams(max_new_tokens=8))
    with pytest.raises(ValidationError):
        SamplingParams(temperature=0.0)
    with pytest.raises(ValidationError):
        SamplingParams(top_p=1.5)


def test_local_engine_serves_the_newest_published_version(tmp_path: Path, model: TinyActorCritic) -> None:
    store = Store.open(f"sqlite:///{tmp_path / 's.db'}")
    engine = LocalTorchEngine(CFG, state=model.state_dict(), latest=lambda: latest_policy(store, "run"), seed=0)
    params = SamplingParams(max_new_tokens=3)
    assert engine.generate([1, 2], params).policy_version == 0
    torch.manual_seed(5)
    newer = TinyActorCritic(CFG)
    path = tmp_path / "policy-v000003.pt"
    torch.save({"model": newer.state_dict(), "actor_opt": {}, "policy_version": 3}, path)
    store.apply([PolicyPublished(run_id="run", version=3, checkpoint=str(path))])
    gen = engine.generate([1, 2], params)
    assert gen.policy_version == 3 and engine.loads == 1
    for name, value in newer.state_dict().items():
        torch.testing.assert_close(engine.model.state_dict()[name], value)
    store.apply([PolicyPublished(run_id="run", version=2, checkpoint=str(path))])  # older: ignored
    assert engine.generate([1, 2], params).policy_version == 3 and engine.loads == 1
    assert set(load_model_state(path)) == set(newer.state_dict())


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
    assert body["input_ids"] == [5, 6, 7] and body["return_logprob"] is True and body["stream"] is False
    assert body["sampling_params"] == {"temperature": 0.8, "top_p": 0.95, "max_new_tokens": 8, "stop_token_ids": [2]}
    assert gen.output_ids.tolist() == [17, 4242, 2]
    np.testing.assert_allclose(gen.logprobs, [-0.25, -1.5, 0.0])
    assert gen.output_ids.dtype == np.int32 and gen.logprobs.dtype == np.float32
    assert gen.finish_reason == "stop" and gen.policy_version == 7
    assert gen.timings["server_latency_s"] == pytest.approx(0.05)
    engine.close()


def test_sglang_version_falls_back_to_the_pushed_one(sglang: tuple[str, type[_FakeSGLang]], tmp_path: Path) -> None:
    url, handler = sglang
    handler.reply = [_response([[-0.1, 9, "x"]], weight_version="default")]  # batch-shaped answer, non-int version
    published = (4, str(tmp_path / "policy-v4"))
    engine = SGLangEngine(url, latest=lambda: published, refresh_interval_s=0.0)
    gen = engine.generate([1], SamplingParams(max_new_tokens=1))
    assert handler.requests[0] == ("/update_weights_from_disk", {"model_path": published[1], "weight_version": "4"})
    assert gen.policy_version == 4 and gen.output_ids.tolist() == [9]
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
