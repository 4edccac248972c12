"""Decision latency of the live scheduler: one signals read (store + Kafka lag) plus the policy, per tick.

On a PostgreSQL store of ≥ 1M tokens (``--executions`` synthetic executions of ``--calls`` model calls:
300 make ~700K tokens; the signal queries scale with executions and run items, not tokens), a live run,
16 cells with 200 role decisions, and, when Kafka is reachable, a 4-partition topic with records and
stored offsets behind its log end. The ticks run once on the machine as it is and, with
``--stress N``, once more while ``stress-ng --cpu N`` loads every core; both are printed side by side
(target p99 ≤ 50 ms).

    python bench/bench_decision_latency.py [--executions 2] [--ticks 200] [--stress 4]

The admin URL comes from ``--admin-url``, ``SAPWOOD_BENCH_DATABASE_URL`` or ``SAPWOOD_TEST_DATABASE_URL``;
Kafka from ``--bootstrap``, ``SAPWOOD_KAFKA_BOOTSTRAP`` or ``SAPWOOD_TEST_KAFKA_BOOTSTRAP``. The last stdout
line is one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import psycopg
from psycopg import sql
from sqlalchemy.engine import make_url

from bench_api import admin_kwargs  # the same admin connection settings as the API benchmark
from sapwood.platform import runs
from sapwood.platform.events import CellHeartbeat, CellRegistered, RoleAssigned
from sapwood.platform.store import Store
from sapwood.platform.synthetic import SynthConfig, synthetic_execution
from sapwood.scheduler.live_signals import KafkaLag, LiveSignalReader
from sapwood.scheduler.policies import ElasticPolicy

TARGET_P99_MS = 50.0


def log(msg: str) -> None:
    print(f"[bench_decision_latency] {msg}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def stressed(cpus: int) -> Iterator[None]:
    """``stress-ng --cpu cpus`` running for the duration (nothing when ``cpus`` is 0)."""
    if cpus <= 0:
        yield
        return
    if shutil.which("stress-ng") is None:
        raise SystemExit("--stress needs stress-ng (the Debian package of that name)")
    proc = subprocess.Popen(["stress-ng", "--cpu", str(cpus), "--quiet"], stdout=subprocess.DEVNULL)
    try:
        time.sleep(1.0)  # let the load take every core before the first tick
        yield
    finally:
        proc.terminate()
        proc.wait(30)


def ticks_ms(reader: LiveSignalReader, policy: ElasticPolicy, ticks: int) -> dict[str, Any]:
    """Signals read, policy, and their sum per tick (ms): p50 and p99 of each."""
    read_ms, decide_ms, total_ms = [], [], []
    for _ in range(ticks):
        t0 = time.perf_counter()
        s = reader.read()
        t1 = time.perf_counter()
        policy.decide(s, {c.cell_id: c.role for c in s.cells})
        t2 = time.perf_counter()
        read_ms.append((t1 - t0) * 1e3)
        decide_ms.append((t2 - t1) * 1e3)
        total_ms.append((t2 - t0) * 1e3)

    def pct(xs: list[float]) -> dict[str, float]:
        return {"p50": round(float(np.percentile(xs, 50)), 3), "p99": round(float(np.percentile(xs, 99)), 3)}

    p99 = float(np.percentile(total_ms, 99))
    return {"signals_ms": pct(read_ms), "policy_ms": pct(decide_ms), "total_ms": pct(total_ms),
            "meets_target": p99 <= TARGET_P99_MS}


def latency(admin_url: str, bootstrap: str | None, executions: int, ticks: int, stress: int = 0,
            calls: int = 300) -> dict[str, Any]:
    """Decision latency on a fresh database of ``admin_url``'s server (dropped afterwards)."""
    name = f"sapwood_bench_sched_{uuid.uuid4().hex[:8]}"
    kw = admin_kwargs(admin_url)
    with psycopg.connect(**kw) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    lag = None
    try:
        store = Store.open(url)
        tokens = 0
        t0 = time.perf_counter()
        for i in range(executions):
            w = synthetic_execution(SynthConfig(seed=200 + i, calls=calls), run_id="bench", task_id=f"t-{i}")
            tokens += store.apply(w.events).tokens
            if (i + 1) % max(1, executions // 10) == 0:
                log(f"loaded {i + 1}/{executions} executions ({tokens:,} tokens) in {time.perf_counter() - t0:.1f} s")
        with store.transaction() as conn:
            runs.create_run(conn, "live", runs.ExecutionFilter(run_id="bench"), kind="live")
        now = time.time()
        store.apply([CellRegistered(cell_id=f"cell-{i:02d}", tier="satellite" if i >= 8 else "core", capacity=4,
                                    created_at=now - 600) for i in range(16)])
        store.apply([CellHeartbeat(cell_id=f"cell-{i:02d}", created_at=now) for i in range(16)])
        store.apply([RoleAssigned(cell_id=f"cell-{i % 16:02d}", role="train" if i % 2 else "rollout",
                                  reason="bench", created_at=now - 500 + i) for i in range(200)])
        partitions = 0
        if bootstrap:
            lag, partitions = kafka_topic(bootstrap, store)
        reader = LiveSignalReader(store.engine, batch_size=64, train_step_cell_s=28800.0, lag=lag)
        policy = ElasticPolicy()
        s = reader.read()  # the first tick waits for the broker's log-end offsets; later ones use the cache
        idle = ticks_ms(reader, policy, ticks)
        log(f"idle: p99 {idle['total_ms']['p99']} ms")
        loaded = None
        if stress > 0:
            with stressed(stress):
                loaded = ticks_ms(reader, policy, ticks)
            log(f"under stress-ng --cpu {stress}: p99 {loaded['total_ms']['p99']} ms")
        reader.close()
        lag = None
        store.close()
        out: dict[str, Any] = {"store_tokens": tokens, "executions": executions, "calls_per_execution": calls,
                               "kafka_partitions": partitions,
                               "ticks": ticks, "target_p99_ms": TARGET_P99_MS, **idle,
                               "ingest_lag_total": s.ingest_lag_total, "backlog_executions": s.backlog_executions}
        if loaded is not None:
            out["stressed"] = {"stress_ng_cpus": stress, **loaded}
        return out
    finally:
        if lag is not None:
            lag.close()
        with psycopg.connect(**kw) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def kafka_topic(bootstrap: str, store: Store) -> tuple[KafkaLag, int]:
    """A fresh 4-partition topic with records in every partition and stored offsets behind the log end."""
    from sapwood.platform.storage.backends import offset_store

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from kafka import KafkaAdminClient, KafkaProducer
    topic, group, parts = f"bench-latency-{uuid.uuid4().hex[:8]}", "bench-ingest", 4
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="sapwood-bench")
    try:
        admin.create_topics({topic: {"num_partitions": parts}}, wait_for_metadata=True)
    finally:
        admin.close()
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    for i in range(400):
        producer.send(topic, key=f"k{i}".encode(), value=b"x", partition=i % parts)
    producer.flush()
    producer.close()
    with store.transaction() as conn:
        offset_store(conn).advance(conn, group, topic, {p: 50 for p in range(parts)}, expected={})
    return KafkaLag(bootstrap, topic, group), parts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ticks", type=int, default=200)
    p.add_argument("--executions", type=int, default=2, help="~700K-token synthetic executions in the store")
    p.add_argument("--calls", type=int, default=300, help="model calls per execution (300: ~700K tokens)")
    p.add_argument("--stress", type=int, default=0, metavar="N", help="run the ticks again under stress-ng --cpu N")
    p.add_argument("--admin-url", default=os.environ.get("SAPWOOD_BENCH_DATABASE_URL")
                   or os.environ.get("SAPWOOD_TEST_DATABASE_URL"))
    p.add_argument("--bootstrap", default=os.environ.get("SAPWOOD_KAFKA_BOOTSTRAP")
                   or os.environ.get("SAPWOOD_TEST_KAFKA_BOOTSTRAP"))
    a = p.parse_args()
    if not a.admin_url:
        raise SystemExit("no PostgreSQL admin URL: --admin-url or SAPWOOD_BENCH_DATABASE_URL")
    print(json.dumps({"bench": "decision_latency", **latency(a.admin_url, a.bootstrap, a.executions, a.ticks,
                                                             a.stress, a.calls)}))


if __name__ == "__main__":
    main()
