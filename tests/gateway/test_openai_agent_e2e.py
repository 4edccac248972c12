"""An unmodified agent loop (the official ``openai`` client) through the gateway in front of real vLLM.

The agent plays a multi-turn task by token ids (it asks for ``return_token_ids`` itself, as TITO agents
do): a chain of turns, a fork (two continuations of one state) and a compaction (it restarts from the
task plus the last output as its summary). Then the store holds exactly that tree and every call's
audit verifies; what vLLM answers directly for the same requests is what was recorded.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sapwood.api.queries.audit import audit
from sapwood.gateway.app import GatewayConfig, create_app
from sapwood.platform.store import Store
from sapwood.rollout.transports import InProcessTransport
from tests.support.live_server import serve_in_thread

openai = pytest.importorskip("openai")

# scripts/test starts the server for these (see tests/gateway/conftest.py)
pytestmark = pytest.mark.vllm

TASK = [11, 12, 13, 14, 15, 16]
OBS = [21, 22, 23]
SAMPLING = {"max_tokens": 3, "temperature": 0.0}


@pytest.fixture
def gateway(vllm_url: str, tmp_path: Path) -> Iterator[tuple[str, Store]]:
    store = Store.open(f"sqlite:///{tmp_path / 'gw.db'}")
    transport = InProcessTransport(store, batch_size=1)
    app = create_app(GatewayConfig(upstreams=[vllm_url], run_id="e2e", ack="durable"), transport)
    with serve_in_thread(app) as url:
        yield url, store
    transport.close()
    store.close()


def _turn(client: Any, prompt: list[int]) -> tuple[list[int], list[int]]:
    """One call; returns (prompt ids, output ids) as the gateway passed them through."""
    r = client.completions.create(
        model="tiny", prompt=prompt, extra_body={"return_token_ids": True, "ignore_eos": True}, **SAMPLING
    )
    choice = r.choices[0].model_dump()
    return choice["prompt_token_ids"], choice["token_ids"]


def _direct_chat(vllm_url: str, msgs: list[dict[str, str]]) -> dict[str, Any]:
    """What vLLM answers for the same chat request without the gateway (with its token ids)."""
    answer: dict[str, Any] = (
        httpx.post(
            f"{vllm_url}/v1/chat/completions",
            timeout=600,
            json={"model": "tiny", "messages": msgs, "return_token_ids": True, **SAMPLING},
        )
        .raise_for_status()
        .json()
    )
    return answer


def _assert_the_one_call_is(store: Store, direct: dict[str, Any]) -> None:
    """The store holds one call; its audit verifies and holds vLLM's direct answer's prompt and output ids."""
    with store.transaction() as conn:
        call_id = conn.exec_driver_sql("SELECT call_id FROM calls").scalar_one()
        a = audit(conn, call_id, tokenizer=None)
    assert a["verified"]
    assert a["input"]["token_ids"].tolist() == direct["prompt_token_ids"]
    assert a["output"]["token_ids"].tolist() == direct["choices"][0]["token_ids"]


def test_agent_chain_fork_and_compaction_are_recorded_as_that_tree(gateway: tuple[str, Store], vllm_url: str) -> None:
    url, store = gateway
    client = openai.OpenAI(base_url=f"{url}/s/agent-1/v1", api_key="unused", max_retries=0, timeout=600)
    p1, o1 = _turn(client, TASK)
    state = [*p1, *o1, *OBS]
    p2, o2 = _turn(client, state)  # next
    other = 31 if o2[0] != 31 else 32  # a continuation that diverges right after the state
    p3, o3 = _turn(client, [*state, other])  # fork: another continuation of the state after turn 1
    p4, o4 = _turn(client, [*TASK[:2], *o3, 41])  # compaction: task head + the last output as summary
    done = httpx.post(f"{url}/v1/sessions/agent-1/finish", json={"status": "success", "reward": 1.0}, timeout=60)
    assert done.status_code == 200, done.text
    metrics = httpx.get(f"{url}/metrics", timeout=60).text
    for kind, n in (("root", 1), ("next", 1), ("fork", 1), ("segment", 1)):
        assert f'sapwood_gateway_placements_total{{kind="{kind}"}} {n}.0' in metrics

    with store.transaction() as conn:
        rows = conn.exec_driver_sql("SELECT call_id FROM calls ORDER BY seq").fetchall()
        assert len(rows) == 4
        audits = [audit(conn, r[0], tokenizer=None) for r in rows]
    assert all(a["verified"] for a in audits)
    assert [a["input"]["token_ids"].tolist() for a in audits] == [p1, p2, p3, p4]
    assert [a["output"]["token_ids"].tolist() for a in audits] == [o1, o2, o3, o4]
    # what vLLM answers directly for the same prompt is what the gateway recorded
    direct = (
        httpx.post(
            f"{vllm_url}/v1/completions",
            timeout=600,
            json={
                "model": "tiny",
                "prompt": p3,
                "logprobs": 1,
                "return_token_ids": True,
                "ignore_eos": True,
                **SAMPLING,
            },
        )
        .raise_for_status()
        .json()["choices"][0]
    )
    assert direct["token_ids"] == o3
    assert audits[2]["output"]["logprobs"].tolist() == pytest.approx(direct["logprobs"]["token_logprobs"], abs=1e-4)


def test_chat_through_the_gateway_records_vllms_rendered_prompt(gateway: tuple[str, Store], vllm_url: str) -> None:
    url, store = gateway
    client = openai.OpenAI(
        base_url=url + "/v1", api_key="unused", max_retries=0, timeout=600, default_headers={"X-Session-Id": "chat-1"}
    )
    msgs = [{"role": "user", "content": "the tree"}]
    r = client.chat.completions.create(model="tiny", messages=msgs, **SAMPLING)
    assert r.choices[0].logprobs is None, "the client asked for no log-probs: the gateway strips them"
    direct = _direct_chat(vllm_url, msgs)
    _assert_the_one_call_is(store, direct)


def test_streamed_chat_is_recorded_like_the_unstreamed_answer(gateway: tuple[str, Store], vllm_url: str) -> None:
    url, store = gateway
    client = openai.OpenAI(base_url=f"{url}/s/stream-1/v1", api_key="unused", max_retries=0, timeout=600)
    msgs = [{"role": "user", "content": "a stream"}]
    pieces = [
        c.choices[0].delta.content or ""
        for c in client.chat.completions.create(model="tiny", messages=msgs, stream=True, **SAMPLING)
        if c.choices
    ]
    direct = _direct_chat(vllm_url, msgs)
    assert "".join(pieces) == direct["choices"][0]["message"]["content"]
    _assert_the_one_call_is(store, direct)
