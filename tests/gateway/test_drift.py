"""Retokenization drift: counted per run, and stored with each call, when the previous chat output does not
come back verbatim."""

from __future__ import annotations

from pathlib import Path

import httpx
import sqlalchemy as sa
from fastapi.testclient import TestClient
from hypothesis import given
from hypothesis import strategies as st

from sapwood.gateway.app import GatewayConfig, create_app
from sapwood.gateway.drift import check_drift
from sapwood.platform import schema as t
from sapwood.platform.store import Store
from sapwood.rollout.transports import InProcessTransport
from tests.support.stub_upstream import render_chat, stub_app

ids = st.lists(st.integers(min_value=0, max_value=9), max_size=8)


@given(prompt=ids, out=st.lists(st.integers(min_value=0, max_value=9), min_size=1, max_size=8), tail=ids)
def test_output_followed_verbatim_is_no_drift(prompt: list[int], out: list[int], tail: list[int]) -> None:
    assert check_drift(prompt, out, prompt + out + tail).checked
    assert check_drift(prompt, out, prompt + out + tail).position is None


@given(prompt=ids, out=st.lists(st.integers(min_value=0, max_value=9), min_size=1, max_size=8),
       k=st.integers(min_value=0), tail=ids)
def test_the_first_differing_id_is_the_drift_position(prompt: list[int], out: list[int], k: int,
                                                      tail: list[int]) -> None:
    k %= len(out)
    changed = [*out[:k], out[k] + 100, *tail]  # differs from the output first at k
    assert check_drift(prompt, out, prompt + changed).position == len(prompt) + k


def test_edges() -> None:
    assert check_drift([1, 2], [3, 4], [1, 2, 3]).position == 3, "a prompt that stops inside the output drifts"
    assert check_drift([1, 2], [3], [1, 9, 3]) == check_drift([1, 2], [3], [5])  # not the same conversation
    assert not check_drift([1, 2], [3], [1, 9, 3]).checked
    assert not check_drift([1], [], [1, 2]).checked, "nothing was generated: nothing to check"
    assert not check_drift([1, 2], [3], [1, 2]).checked, "the same prompt again is another sample, not drift"


def test_chat_turns_with_the_assistant_text_changed_are_recorded_and_counted_per_run(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path / 'gw.db'}")
    transport = InProcessTransport(store, batch_size=1)
    app = create_app(GatewayConfig(upstreams=["http://stub"], run_id="drift", ack="durable"), transport,
                     client=httpx.AsyncClient(transport=httpx.ASGITransport(app=stub_app())))
    messages = [{"role": "user", "content": "fix the bug"}]
    with TestClient(app) as client:
        def turn(msgs: list[dict[str, str]]) -> dict[str, str]:
            r = client.post("/s/d/v1/chat/completions", json={"messages": msgs, "max_tokens": 6})
            assert r.status_code == 200, r.text
            return dict(r.json()["choices"][0]["message"])

        first = turn(messages)
        kept = [*messages, first, {"role": "user", "content": "and now?"}]
        second = turn(kept)  # the answer came back verbatim: checked, no drift
        edited = {**second, "content": second["content"][:2] + "X" + second["content"][3:]}
        turn([*kept, edited, {"role": "user", "content": "again"}])  # re-rendered differently at char 2
        metrics = client.get("/metrics").text
    assert 'sapwood_gateway_drift_checked_total{run="drift"} 2.0' in metrics
    assert 'sapwood_gateway_drift_total{run="drift"} 1.0' in metrics
    assert int(store.stats()["calls"]) == 3, "a drifted call is recorded anyway"
    prev_prompt = render_chat(kept)
    third_prompt = render_chat([*kept, edited, {"role": "user", "content": "again"}])
    assert check_drift(prev_prompt, [ord(c) for c in second["content"]], third_prompt).position == len(prev_prompt) + 2
    with store.transaction() as conn:  # the check is stored with each call, where it first differed included
        stored = [tuple(r) for r in conn.execute(sa.select(t.calls.c.drift_checked, t.calls.c.drift_at)
                                                 .order_by(t.calls.c.seq)).all()]
    assert stored == [(False, None), (True, None), (True, len(prev_prompt) + 2)]
    (run,) = store.drift("drift")
    assert (run.calls, run.checked, run.drifted, run.first_position) == (3, 2, 1, len(prev_prompt) + 2)
    assert run.rate == 0.5
    transport.close()
    store.close()
