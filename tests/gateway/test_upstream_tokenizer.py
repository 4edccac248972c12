"""The gateway names the upstream's tokenizer (read from vLLM's model folder) in each execution it records,
so the API (``SAPWOOD_TOKENIZER=recorded``) shows text per token in audits and node pages; against real vLLM."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from sapwood.gateway.app import GatewayConfig, create_app
from sapwood.platform.store import Store
from sapwood.rollout.transports import InProcessTransport
from tests.support.api_client import make_client, make_keys
from tests.support.live_server import serve_in_thread

pytestmark = pytest.mark.vllm

MSGS = [{"role": "user", "content": "the tree"}]


def _chat_through(vllm_url: str, tmp_path: Path, model_dir: Path | None) -> tuple[Store, dict[str, Any], str, Any]:
    """One chat call through a gateway (``model_dir``: --upstream-model-dir; None: found from /v1/models)."""
    store = Store.open(f"sqlite:///{tmp_path / 'gw.db'}")
    transport = InProcessTransport(store, batch_size=1)
    config = GatewayConfig(upstreams=[vllm_url], run_id="tok", ack="durable",
                           upstream_model_dir=None if model_dir is None else str(model_dir))
    with serve_in_thread(create_app(config, transport)) as url:
        health = httpx.get(f"{url}/health", timeout=60).json()
        r = httpx.post(f"{url}/s/tok-1/v1/chat/completions", timeout=600,
                       json={"model": "tiny", "messages": MSGS, "max_tokens": 4, "temperature": 0.0})
        assert r.status_code == 200, r.text
    transport.close()
    return store, r.json(), r.headers["x-sapwood-call-id"], health


@pytest.fixture(params=["named", "found"])
def recorded(request: pytest.FixtureRequest, vllm_url: str, vllm_model_dir: Path,
             tmp_path: Path) -> Iterator[tuple[Store, dict[str, Any], str, Any]]:
    store, answer, call_id, health = _chat_through(
        vllm_url, tmp_path, vllm_model_dir if request.param == "named" else None)
    yield store, answer, call_id, health
    store.close()


def test_audits_and_nodes_show_the_upstream_tokenizers_text(recorded: tuple[Store, dict[str, Any], str, Any],
                                                            vllm_model_dir: Path) -> None:
    store, answer, call_id, health = recorded
    file = (vllm_model_dir / "tokenizer.json").resolve()
    assert health["tokenizer"] == str(file)
    with store.transaction() as conn:
        meta = conn.exec_driver_sql("SELECT metadata FROM executions").scalar_one()
    meta = meta if isinstance(meta, dict) else json.loads(meta)
    assert meta["tokenizer"] == str(file)
    assert meta["tokenizer_sha256"] == hashlib.sha256(file.read_bytes()).hexdigest()

    keys = make_keys(store)
    with make_client(store, tokenizer="recorded") as api:
        audit = api.get(f"/v1/calls/{call_id}/audit", headers=keys.headers("read")).json()
        node = api.get(f"/v1/nodes/{audit['output']['node_id']}", headers=keys.headers("read")).json()
        features = api.get("/ui/features.json").json()
    content = answer["choices"][0]["message"]["content"]
    assert audit["output"]["text"] == content, "the output decodes to what vLLM answered"
    assert len(audit["output"]["token_texts"]) == audit["output"]["length"]
    assert audit["input"]["text"] == "<|im_start|>user\nthe tree<|im_end|>\n<|im_start|>assistant\n"
    assert node["text"] == content
    assert features["tokenizer"] is True
    with make_client(store) as api:  # the default, "none": no text
        plain = api.get(f"/v1/calls/{call_id}/audit", headers=keys.headers("read")).json()
    assert plain["output"]["text"] is None


def test_a_tokenizer_changed_since_the_recording_is_not_used(
        recorded: tuple[Store, dict[str, Any], str, Any], tmp_path: Path) -> None:
    store, _answer, call_id, _health = recorded
    with store.transaction() as conn:  # the recording names a copy, then the copy changes
        meta_raw = conn.exec_driver_sql("SELECT metadata FROM executions").scalar_one()
        meta = meta_raw if isinstance(meta_raw, dict) else json.loads(meta_raw)
        copy = tmp_path / "tokenizer.json"
        copy.write_bytes(Path(meta["tokenizer"]).read_bytes())
        meta["tokenizer"] = str(copy)
        conn.execute(sa.text("UPDATE executions SET metadata = :m"), {"m": json.dumps(meta)})
    copy.write_bytes(copy.read_bytes().replace(b'"<|im_end|>"', b'"<|im_END|>"'))
    keys = make_keys(store)
    with make_client(store, tokenizer="recorded") as api:
        audit = api.get(f"/v1/calls/{call_id}/audit", headers=keys.headers("read")).json()
    assert audit["output"]["text"] is None
