"""The session journal: a gateway that lost its process continues its open sessions from the journal.

Gateway A answers calls (``--ack=async``) over a transport that never delivers (what a killed process
leaves: events answered but not stored) and is abandoned without a shutdown. Gateway B starts on the same
journal and a real store: it sends A's events again and continues A's open session as the same execution,
its next call the next one of the same chain.
"""

from __future__ import annotations

import struct
from pathlib import Path

import httpx
from fastapi.testclient import TestClient

from sapwood.api.queries.audit import audit
from sapwood.gateway.app import GatewayConfig, create_app
from sapwood.gateway.journal import SessionJournal, open_executions
from sapwood.platform.events import Event
from sapwood.platform.store import Store
from sapwood.rollout.recorder import Recorder
from sapwood.rollout.transports import InProcessTransport, MemoryTransport, Transport
from tests.support.stub_upstream import stub_app


class Blackhole(Transport):
    """Accepts every event and never delivers one (the events of a gateway killed before delivery)."""

    def send(self, event: Event) -> None:
        pass


def _gateway(journal: Path, transport: Transport, ack: str = "async") -> TestClient:
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=stub_app()))
    config = GatewayConfig(upstreams=["http://stub"], run_id="journal", ack=ack, journal_path=str(journal))
    return TestClient(create_app(config, transport, client=http))


def _call(client: TestClient, session: str, prompt: list[int]) -> tuple[list[int], str]:
    r = client.post(f"/s/{session}/v1/completions", json={"prompt": prompt, "max_tokens": 3, "return_token_ids": True})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    return [*choice["prompt_token_ids"], *choice["token_ids"]], r.headers["x-sapwood-placement"]


def test_a_restarted_gateway_continues_the_open_session_as_the_same_execution(tmp_path: Path) -> None:
    journal = tmp_path / "gw.journal"
    killed = _gateway(journal, Blackhole())  # no lifespan: never shut down, nothing delivered
    ctx1, kind1 = _call(killed, "s1", [5, 6, 7])
    ctx2, kind2 = _call(killed, "s1", [*ctx1, 9])
    ctx_done, _ = _call(killed, "done", [4, 4])
    assert killed.post("/v1/sessions/done/finish", json={"status": "success"}).status_code == 200
    assert (kind1, kind2) == ("root", "next")
    killed.app.state.gateway.recorder.close(5.0)  # type: ignore[attr-defined]

    store = Store.open(f"sqlite:///{tmp_path / 'gw.db'}")
    transport = InProcessTransport(store, batch_size=1)
    try:
        with _gateway(journal, transport, ack="durable") as restarted:
            assert restarted.get("/health").json()["resumed_sessions"] == 1, "s1 is open, 'done' is finished"
            ctx3, kind3 = _call(restarted, "s1", [*ctx2, 10])
            assert kind3 == "next", "the call continues the chain the killed gateway had"
            r = restarted.post("/v1/sessions/s1/finish", json={"status": "success", "reward": 1.0})
            assert r.status_code == 200, r.text
        with store.transaction() as conn:
            execs = conn.exec_driver_sql(
                "SELECT execution_id, status FROM executions ORDER BY started_at").fetchall()
            rows = conn.exec_driver_sql("SELECT call_id, execution_id FROM calls ORDER BY seq").fetchall()
            audits = {r[0]: audit(conn, r[0], tokenizer=None) for r in rows}
    finally:
        transport.close()
        store.close()
    assert [status for _, status in execs] == ["success", "success"], "one execution per session, both finished"
    s1 = [r for r in rows if r[1] == rows[0][1]]
    assert len(rows) == 4
    assert len(s1) == 3, "the three calls of s1 are one execution"
    inputs = [audits[r[0]]["input"]["token_ids"].tolist() for r in s1]
    outputs = [audits[r[0]]["output"]["token_ids"].tolist() for r in s1]
    assert [i + o for i, o in zip(inputs, outputs, strict=True)] == [ctx1, ctx2, ctx3]
    assert all(a["verified"] for a in audits.values())
    assert ctx_done in [a["input"]["token_ids"].tolist() + a["output"]["token_ids"].tolist() for a in audits.values()]


def test_the_journal_is_rewritten_with_the_open_sessions_once_delivered(tmp_path: Path) -> None:
    journal = tmp_path / "gw.journal"
    killed = _gateway(journal, Blackhole())
    _call(killed, "open", [5, 6])
    _call(killed, "done", [7, 8])
    assert killed.post("/v1/sessions/done/finish", json={}).status_code == 200
    killed.app.state.gateway.recorder.close(5.0)  # type: ignore[attr-defined]
    before = SessionJournal(journal).read()
    assert [e.kind for e in before].count("execution_started") == 2

    restarted = _gateway(journal, MemoryTransport())
    restarted.app.state.gateway.recorder.close(5.0)  # type: ignore[attr-defined]
    after = SessionJournal(journal).read()
    assert set(open_executions(after)) == {"open"}
    assert [e.event_id for e in after] == [e.event_id for e in before if e.execution_id == after[0].execution_id]


def test_a_torn_last_record_is_left_out(tmp_path: Path) -> None:
    path = tmp_path / "gw.journal"
    journal = SessionJournal(path)
    rec = Recorder(MemoryTransport(), run_id="torn")
    ex = rec.start("t", metadata={"session_id": "s"})
    call = ex.call([1, 2, 3], [4], [-0.5])
    events = [*rec.transport.events]  # type: ignore[attr-defined]
    for e in events:
        journal.append(e)
    journal.close()
    whole = path.read_bytes()
    path.write_bytes(whole + struct.pack("<I", 1000) + b"SPWD")  # a write the process died in
    assert [e.event_id for e in SessionJournal(path).read()] == [e.event_id for e in events]
    path.write_bytes(whole[:-3])
    assert [e.event_id for e in SessionJournal(path).read()] == [events[0].event_id]
    assert call.event_id == events[-1].event_id


def test_resume_continues_the_sequence_and_the_tree() -> None:
    transport = MemoryTransport()
    rec = Recorder(transport, run_id="resume")
    ex = rec.start("t", metadata={"session_id": "s"})
    first = ex.call([1, 2, 3], [4, 5], [-0.5, -0.25])
    ex.call([1, 2, 3, 4, 5, 6], [7], [-0.1])
    events = list(transport.events)
    again = Recorder(MemoryTransport(), run_id="resume").resume(events)
    assert again.execution_id == ex.execution_id
    assert again.head == ex.head
    nxt = again.call([1, 2, 3, 4, 5, 6, 7, 8], [9], [-0.2])
    ref = ex.call([1, 2, 3, 4, 5, 6, 7, 8], [9], [-0.2])
    assert (nxt.seq, nxt.parent, nxt.appended.tolist(), nxt.input_digest) == (
        ref.seq, ref.parent, ref.appended.tolist(), ref.input_digest)
    fork = again.call([1, 2, 3, 4, 5, 11], [12], [-0.3])
    assert fork.parent == first.output_node_id, "the restored tree matches prefixes like the original"
