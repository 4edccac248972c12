"""Audit: every call's exact input rebuilt from the tree equals what the producer recorded; reverse audit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa

from sapwood.api import ApiSettings, create_app
from sapwood.platform import schema as t
from sapwood.platform.errors import ValidationError
from sapwood.platform.events import ModelCall
from sapwood.platform.store import Store
from sapwood.platform.tokens import digest_bytes
from sapwood.platform.writer import ExecutionWriter
from tests.support.api_client import Keys, TestClient, calls_of, make_client, recorded_input


def audit(client: TestClient, keys: Keys, call_id: str, **params: Any) -> dict[str, Any]:
    r = client.get(f"/v1/calls/{call_id}/audit", headers=keys.headers("read"), params=params)
    assert r.status_code == 200, r.text
    return r.json()


def test_audit_is_the_exact_recorded_input_across_forks_and_segments(
        client: TestClient, keys: Keys, writers: list[ExecutionWriter]) -> None:
    segments: set[int] = set()
    fork_children = 0
    for w in writers[:2]:
        fork_points = {e.at_node for e in w.events if e.kind == "fork"}
        for call in calls_of(w):
            a = audit(client, keys, call.event_id)
            expected = recorded_input(w, call)
            assert np.array_equal(np.array(a["input"]["token_ids"], dtype=np.int32), expected), call.event_id
            assert a["verified"]
            assert a["input"]["verified"]
            assert a["input"]["recorded_digest"] == call.input_digest == a["input"]["computed_digest"]
            assert a["input"]["length"] == expected.size == a["call"]["input_len"]
            assert a["output"]["token_ids"] == call.output_ids.tolist()
            assert np.array_equal(np.array(a["output"]["logprobs"], dtype=np.float32), call.output_logprobs)
            assert a["call"]["policy_version"] == call.policy_version
            assert a["engine"] == "synthetic"
            assert a["timings"] == call.timings
            assert a["sampling_params"] == {"temperature": 1.0, "top_p": 1.0}
            assert a["call"]["call_kind"] == call.call_kind
            assert a["input"]["text"] is None
            path = a["input"]["path"]
            assert path[0]["depth"] == 0
            assert sum(p["length"] for p in path) == expected.size
            assert path[-1]["node_id"] == a["call"]["input_node"]
            segments.add(a["call"]["segment"])
            fork_children += call.parent in fork_points
    assert segments == {0, 1, 2}
    assert fork_children == 8  # both branches of 2 forks in 2 executions


def test_binary_input_matches_and_reports_verification(client: TestClient, keys: Keys,
                                                       writers: list[ExecutionWriter]) -> None:
    w = writers[0]
    call = calls_of(w)[-1]
    r = client.get(f"/v1/calls/{call.event_id}/input.bin", headers=keys.headers("read"))
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/octet-stream"
    assert np.array_equal(np.frombuffer(r.content, dtype="<i4"), recorded_input(w, call))
    assert r.headers["x-sapwood-verified"] == "true"
    assert r.headers["x-sapwood-computed-digest"] == call.input_digest == digest_bytes(r.content).hex()


def test_audit_without_tokens_and_unknown_call(client: TestClient, keys: Keys, writers: list[ExecutionWriter]) -> None:
    call = calls_of(writers[0])[0]
    a = audit(client, keys, call.event_id, tokens=False)
    assert a["input"]["token_ids"] is None
    assert a["output"]["logprobs"] is None
    assert a["verified"]
    r = client.get("/v1/calls/00000000-0000-4000-8000-000000000000/audit", headers=keys.headers("read"))
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "not_found"


def test_a_tampered_span_fails_verification(pg_store: Store, keys: Keys, writers: list[ExecutionWriter]) -> None:
    w = writers[0]
    call = calls_of(w)[5]
    observation = next(e for e in w.events if e.kind == "observation")  # in every later call's input
    digest = digest_bytes(observation.token_ids.tobytes())
    with pg_store.transaction() as conn:
        data = conn.execute(sa.select(t.spans.c.data).where(t.spans.c.digest == digest)).scalar_one()
        conn.execute(t.spans.update().where(t.spans.c.digest == digest).values(data=bytes(data)[::-1]))
    with make_client(pg_store) as client:
        a = audit(client, keys, call.event_id)
    assert not a["verified"]
    assert not a["input"]["verified"]
    assert a["input"]["computed_digest"] != a["input"]["recorded_digest"] == call.input_digest


def _saw(w: ExecutionWriter, call: ModelCall, node_id: str) -> bool:
    cur: str | None = call.input_node_id or call.parent
    while cur is not None:
        if cur == node_id:
            return True
        cur = w.nodes[cur].parent
    return False


def test_reverse_audit_lists_the_calls_whose_input_contains_a_node(
        client: TestClient, keys: Keys, writers: list[ExecutionWriter]) -> None:
    w = writers[0]
    calls = calls_of(w)
    fork_point = next(e.at_node for e in w.events if e.kind == "fork")
    summary = next(c.output_node_id for c in calls if c.call_kind == "summary")
    second_segment_root = next(e.root_node_id for e in w.events if e.kind == "segment_boundary")
    system_prompt = next(e.node_id for e in w.events if e.kind == "prompt")
    checked = 0
    for node in (system_prompt, fork_point, summary, second_segment_root, calls[0].output_node_id):
        expected = [c.event_id for c in calls if _saw(w, c, node)]
        got: list[str] = []
        cursor = None
        while True:
            params: dict[str, Any] = {"limit": 3, **({"cursor": cursor} if cursor else {})}
            r = client.get(f"/v1/nodes/{node}/calls", headers=keys.headers("read"), params=params)
            assert r.status_code == 200, r.text
            page = r.json()
            got += [c["call_id"] for c in page["items"]]
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert got == expected, node
        assert page["token_end"] - page["token_start"] == w.nodes[node].tokens.size
        checked += bool(expected)
    assert checked == 4  # the summary node ends its context: no call saw it


def test_decoded_text_with_the_char_tokenizer(pg_store: Store, keys: Keys, writers: list[ExecutionWriter]) -> None:
    call = calls_of(writers[0])[1]
    with make_client(pg_store, tokenizer="char") as client:
        a = audit(client, keys, call.event_id)
        node = client.get(f"/v1/nodes/{call.output_node_id}", headers=keys.headers("read")).json()
    assert a["input"]["text"] == "".join(map(chr, a["input"]["token_ids"]))
    assert a["output"]["text"] == "".join(map(chr, call.output_ids.tolist())) == node["text"]
    with make_client(pg_store, tokenizer="tests.support.api_client:hex_tokenizer") as client:
        a = audit(client, keys, call.event_id)
    assert a["output"]["text"] == " ".join(f"{i:x}" for i in call.output_ids.tolist())


def test_decoded_text_with_a_local_tokenizer_json(pg_store: Store, keys: Keys, writers: list[ExecutionWriter],
                                                  tmp_path: Path) -> None:
    from sapwood.api.tokenizer import FileTokenizer
    from tests.support.tiny_tokenizer import write_tiny_tokenizer

    folder = write_tiny_tokenizer(tmp_path / "tok")
    tok = FileTokenizer(folder / "tokenizer.json")
    call = calls_of(writers[0])[1]
    with make_client(pg_store, tokenizer=str(folder)) as client:
        a = audit(client, keys, call.event_id)
    assert a["output"]["text"] == tok.decode(call.output_ids.tolist())
    assert a["input"]["text"] == tok.decode(a["input"]["token_ids"])


@pytest.mark.parametrize("spec", ["no.such.module:factory", "json:dumps", "nodots"])
def test_a_bad_tokenizer_setting_fails_at_startup(spec: str) -> None:
    with pytest.raises(ValidationError, match="SAPWOOD_TOKENIZER"):
        create_app(ApiSettings(database_url="sqlite://", tokenizer=spec))
