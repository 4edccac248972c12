"""kill -9 of a ``sapwood gateway --ack=durable`` process under load, and what the store holds afterwards.

:func:`kill_under_load` runs the gateway as deployed (a subprocess, Kafka transport) in front of an
instant stand-in upstream; ``sessions`` client threads send chained completions, each with a prompt
no other request has; once ``kill_after`` calls were answered the gateway gets SIGKILL. The real
ingest service then reads the topic into the store, and :class:`KillFigures` compares: every call a
client got a 200 for must be stored (lost = 0), no prompt may be stored twice (duplicated = 0); calls
in flight at the kill may or may not be stored (they were never answered).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import httpx

from sapwood.platform.store import Store
from tests.support.kafka_ingest import caught_up, create_topic, ingest_config, running_ingest, wait_until
from tests.support.live_server import free_port, serve_in_thread
from tests.support.stub_upstream import stub_app

R = TypeVar("R")


@dataclass(frozen=True)
class KillFigures:
    """Counts of one kill -9 round (calls), and the answered calls/s before the kill."""

    answered: int
    stored: int
    lost: int
    duplicated: int
    stored_unanswered: int
    calls_per_s: float


def _gateway(upstream: str, bootstrap: str, topic: str, port: int, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "SAPWOOD_KAFKA_TOPIC": topic}
    args = [sys.executable, "-m", "sapwood.platform.cli", "gateway", "--upstream", upstream, "--port", str(port),
            "--bootstrap", bootstrap, "--ack", "durable", "--run-id", "kill9", "--no-journal"]
    with open(log, "ab") as out:
        return subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT)


def _stored(store: Store) -> tuple[Counter[str], Counter[tuple[str, bytes]]]:
    """Stored call ids, and stored (execution, exact input) pairs, each with its count."""
    ids: Counter[str] = Counter()
    prompts: Counter[tuple[str, bytes]] = Counter()
    with store.engine.connect() as conn:
        rows = conn.exec_driver_sql("SELECT call_id, execution_id FROM calls").all()
    for call_id, execution_id in rows:
        cid = str(uuid.UUID(str(call_id)))
        ids[cid] += 1
        prompts[(str(execution_id), store.reconstruct_input(cid).tobytes())] += 1
    return ids, prompts


def kill_under_load(bootstrap: str, database_url: str, workdir: Path, *, sessions: int = 8,
                    kill_after: int = 60, timeout_s: float = 120.0) -> KillFigures:
    """One round: load, SIGKILL after ``kill_after`` answers, ingest, compare (see the module doc)."""
    topic = create_topic(bootstrap, 2, prefix="test-gateway-kill")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    answered: list[str] = []
    lock = threading.Lock()
    enough = threading.Event()
    stop = threading.Event()
    with serve_in_thread(stub_app()) as upstream:
        proc = _gateway(upstream, bootstrap, topic, port, workdir / "gateway.log")
        try:
            wait_until(lambda: healthy(base, proc), timeout_s, "the gateway to answer /health")

            def client(k: int) -> None:
                prompt = [7, 8, k + 10]
                with httpx.Client(timeout=30) as http:
                    while not stop.is_set():
                        try:
                            r = http.post(f"{base}/s/kill{k}/v1/completions",
                                          json={"prompt": prompt, "max_tokens": 3, "return_token_ids": True})
                        except httpx.HTTPError:
                            return  # the gateway is gone: this call got no answer
                        if r.status_code != 200:
                            continue  # refused (429): not answered, the client tries again
                        choice = r.json()["choices"][0]
                        with lock:
                            answered.append(r.headers["x-sapwood-call-id"])
                            if len(answered) >= kill_after:
                                enough.set()
                        prompt = [*choice["prompt_token_ids"], *choice["token_ids"], 3]

            threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(sessions)]
            t0 = time.perf_counter()
            for t in threads:
                t.start()
            assert enough.wait(timeout_s), f"only {len(answered)} calls answered in {timeout_s} s"
            os.kill(proc.pid, signal.SIGKILL)
            elapsed = time.perf_counter() - t0
            proc.wait(30)
            stop.set()
            for t in threads:
                t.join(30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(30)
    with lock:
        got = list(answered)
    ids, prompts = ingested(database_url, bootstrap, topic, timeout_s, _stored)
    return KillFigures(
        answered=len(got),
        stored=sum(ids.values()),
        lost=len(set(got) - set(ids)),
        duplicated=sum(n - 1 for n in ids.values()) + sum(n - 1 for n in prompts.values()),
        stored_unanswered=len(set(ids) - set(got)),
        calls_per_s=len(got) / elapsed,
    )


def ingested(database_url: str, bootstrap: str, topic: str, timeout_s: float, read: Callable[[Store], R]) -> R:
    """Run the real ingest until it has read the whole topic into the store, then ``read`` the store."""
    store = Store.open(database_url)
    try:
        config = ingest_config(database_url, bootstrap, topic)
        with running_ingest(config):
            wait_until(lambda: caught_up(store.engine, bootstrap, topic, config.group), timeout_s,
                       "ingest to read the whole topic")
        return read(store)
    finally:
        store.close()


def healthy(base: str, proc: subprocess.Popen[bytes]) -> bool:
    """Whether the gateway process answers /health (AssertionError once it exited)."""
    if proc.poll() is not None:
        raise AssertionError(f"the gateway exited with status {proc.returncode} before it answered")
    try:
        return httpx.get(base + "/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


__all__ = ["KillFigures", "healthy", "ingested", "kill_under_load"]
