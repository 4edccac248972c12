"""kill -9 of a ``sapwood gateway`` process with open sessions, a restart on the same journal, and the store after.

:func:`kill_and_restart` runs the gateway as deployed (a subprocess, Kafka transport, a session journal)
in front of an instant stand-in upstream. ``sessions`` client threads send chained completions, each
session its own prompts; once ``kill_after`` calls were answered the gateway gets SIGKILL. A second
gateway process starts on the same journal; every client goes on from its last answered context for
``calls_after`` more calls and finishes its session. The real ingest then reads the topic into the store
and :class:`RestartFigures` says what it holds per session.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import sqlalchemy as sa

from sapwood.platform import schema as t
from sapwood.platform.store import Store
from tests.support.gateway_kill import healthy, ingested
from tests.support.kafka_ingest import count_rows, create_topic, wait_until
from tests.support.live_server import free_port, serve_in_thread
from tests.support.private_kafka import PrivateBroker
from tests.support.stub_upstream import stub_app


@dataclass
class RestartFigures:
    """What the store holds after the kill and the restart (calls; per session where it says so)."""

    answered: int
    resumed: int
    #: Session id -> its executions in the store (1 when the session went on as one execution).
    executions: dict[str, int] = field(default_factory=dict)
    #: Session id -> its executions' status.
    statuses: dict[str, list[str]] = field(default_factory=dict)
    #: Session id -> context roots in its tree (1: one tree).
    roots: dict[str, int] = field(default_factory=dict)
    lost: int = 0
    duplicated: int = 0
    stored_unanswered: int = 0
    dead_letters: int = 0
    #: Answered calls whose stored input is not the prompt the client sent.
    wrong_inputs: int = 0


def _gateway(upstream: str, bootstrap: str, topic: str, port: int, journal: Path, ack: str,
             log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "SAPWOOD_KAFKA_TOPIC": topic}
    args = [sys.executable, "-m", "sapwood.platform.cli", "gateway", "--upstream", upstream, "--port", str(port),
            "--bootstrap", bootstrap, "--ack", ack, "--run-id", "restart", "--journal", str(journal)]
    with open(log, "ab") as out:
        return subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT)


class _Client:
    """One session's chained calls; remembers what was answered (call id -> prompt) and the last context."""

    def __init__(self, k: int) -> None:
        self.session = f"restart{k}"
        self.context = [7, 8, k + 10]
        self.answered: dict[str, list[int]] = {}

    def call(self, http: httpx.Client, base: str) -> bool:
        """One call; False when the gateway did not answer (gone)."""
        prompt = [*self.context, 3]
        try:
            r = http.post(f"{base}/s/{self.session}/v1/completions",
                          json={"prompt": prompt, "max_tokens": 3, "return_token_ids": True})
        except httpx.HTTPError:
            return False
        if r.status_code != 200:
            return True  # refused (429): not answered, the client tries again
        choice = r.json()["choices"][0]
        self.answered[r.headers["x-sapwood-call-id"]] = prompt
        self.context = [*choice["prompt_token_ids"], *choice["token_ids"]]
        return True


def kill_and_restart(bootstrap: str, database_url: str, workdir: Path, *, ack: str = "durable", sessions: int = 4,
                     kill_after: int = 24, calls_after: int = 3, timeout_s: float = 300.0,
                     outage: PrivateBroker | None = None) -> RestartFigures:
    """One round (see the module doc); ``timeout_s`` bounds each wait. ``outage`` (the broker at
    ``bootstrap``, ``--ack=async``): after ``kill_after`` answers it is stopped, and the gateway is killed
    once a call was answered while it was down (its events are then in the journal only); the broker
    starts again before the restart."""
    topic = create_topic(bootstrap, 2, prefix="test-gateway-restart")
    journal = workdir / "gateway.journal"
    clients = [_Client(k) for k in range(sessions)]
    lock = threading.Lock()
    enough, stop, down, answered_down = threading.Event(), threading.Event(), threading.Event(), threading.Event()
    total = [0]
    with serve_in_thread(stub_app()) as upstream:
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        first = _gateway(upstream, bootstrap, topic, port, journal, ack, workdir / "gateway-1.log")
        try:
            wait_until(lambda: healthy(base, first), timeout_s, "the first gateway to answer /health")

            def load(c: _Client) -> None:
                with httpx.Client(timeout=timeout_s) as http:
                    while not stop.is_set():
                        before = len(c.answered)
                        if not c.call(http, base):
                            return
                        with lock:
                            total[0] += len(c.answered) - before
                            if total[0] >= kill_after:
                                enough.set()
                            if len(c.answered) > before and down.is_set():
                                answered_down.set()

            threads = [threading.Thread(target=load, args=(c,), daemon=True) for c in clients]
            for th in threads:
                th.start()
            assert enough.wait(timeout_s), f"only {total[0]} calls answered in {timeout_s} s"
            if outage is not None:
                outage.stop()
                down.set()
                assert answered_down.wait(timeout_s), "no call was answered while the broker was down"
            os.kill(first.pid, signal.SIGKILL)
            first.wait(timeout_s)
            stop.set()
            for th in threads:
                th.join(timeout_s)
        finally:
            if first.poll() is None:
                first.kill()
                first.wait(timeout_s)
        if outage is not None:
            outage.start()
        second = _gateway(upstream, bootstrap, topic, port, journal, ack, workdir / "gateway-2.log")
        try:
            wait_until(lambda: healthy(base, second), timeout_s, "the restarted gateway to answer /health")
            resumed = int(httpx.get(base + "/health", timeout=timeout_s).json()["resumed_sessions"])
            with httpx.Client(timeout=timeout_s) as http:
                for c in clients:
                    goal = len(c.answered) + calls_after
                    while len(c.answered) < goal:
                        assert c.call(http, base), "the restarted gateway stopped answering"
                    done = http.post(f"{base}/v1/sessions/{c.session}/finish", json={"status": "success"})
                    assert done.status_code == 200, done.text
            second.send_signal(signal.SIGTERM)  # a clean stop drains what is queued (uvicorn re-raises the signal)
            code = second.wait(timeout_s)
            assert code in (0, -signal.SIGTERM), f"the restarted gateway did not stop cleanly (exit {code})"
        finally:
            if second.poll() is None:
                second.kill()
                second.wait(timeout_s)
    return ingested(database_url, bootstrap, topic, timeout_s, lambda store: _figures(store, clients, resumed))


def _figures(store: Store, clients: list[_Client], resumed: int) -> RestartFigures:
    answered = {cid: prompt for c in clients for cid, prompt in c.answered.items()}
    figures = RestartFigures(answered=len(answered), resumed=resumed, dead_letters=count_rows(store.engine,
                                                                                             t.dead_letters))
    e, n = t.executions.c, t.nodes.c
    with store.engine.connect() as conn:
        execs = conn.execute(sa.select(e.execution_id, e.metadata, e.status).where(e.run_id == "restart")).all()
        by_session: dict[str, list[str]] = {}
        for execution_id, meta, status in execs:
            session = str(meta.get("session_id"))
            by_session.setdefault(session, []).append(str(execution_id))
            figures.statuses.setdefault(session, []).append(str(status))
        for session, ids in by_session.items():
            figures.executions[session] = len(ids)
            figures.roots[session] = int(conn.execute(sa.select(sa.func.count()).select_from(t.nodes).where(
                n.execution_id.in_(ids), n.parent_id.is_(None))).scalar_one())
        rows = conn.exec_driver_sql("SELECT call_id FROM calls").all()
    ids = Counter(str(uuid.UUID(str(r[0]))) for r in rows)
    figures.lost = len(set(answered) - set(ids))
    figures.duplicated = sum(k - 1 for k in ids.values())
    figures.stored_unanswered = len(set(ids) - set(answered))
    figures.wrong_inputs = sum(1 for cid, prompt in answered.items()
                               if cid in ids and store.reconstruct_input(cid).tolist() != prompt)
    return figures


__all__ = ["RestartFigures", "kill_and_restart"]
