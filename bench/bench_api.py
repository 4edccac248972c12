"""REST API latency under load: tree of a 300-call execution and audit of a ~128K-token context.

Loads several ~700K-token synthetic executions with forks and compaction segments into a fresh
PostgreSQL database (≥ 1M tokens), serves the API with uvicorn (several workers), and drives it
with wrk (a real HTTP load generator) at several concurrency levels. Reports p50/p90/p99 latency
and requests/s per endpoint; the last stdout line is one JSON object.

    python scripts/services.py start && source .services/env      # or any PostgreSQL server
    python bench/bench_api.py [--executions 3] [--workers 2] [--duration 10] [--keep]

Needs ``wrk`` on PATH (Debian: ``apt-get install wrk``). The admin URL comes from ``--admin-url``,
``SAPWOOD_BENCH_DATABASE_URL`` or ``SAPWOOD_TEST_DATABASE_URL``; the benchmark database is created
there and dropped afterwards unless ``--keep`` (a kept database is reused by the next run).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psycopg
import sqlalchemy as sa
from psycopg import sql
from sqlalchemy.engine import make_url

from sapwood.api.auth import create_key
from sapwood.platform import schema as t
from sapwood.platform.store import Store
from sapwood.platform.synthetic import SynthConfig, synthetic_execution

DB_NAME = "sapwood_bench_api"
TARGET_P99_MS = 50.0
AUDIT_CONTEXT = 128 * 1024

WRK_SCRIPT = """
done = function(summary, latency, requests)
  io.write(string.format(
    '{"requests": %d, "duration_us": %d, "bytes": %d, "non_2xx": %d, "socket_errors": %d, '
    .. '"p50_us": %d, "p90_us": %d, "p99_us": %d, "max_us": %d}\\n',
    summary.requests, summary.duration, summary.bytes, summary.errors.status,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max))
end
"""


def log(msg: str) -> None:
    print(f"[bench_api] {msg}", file=sys.stderr, flush=True)


def admin_kwargs(url: str) -> dict[str, Any]:
    u = make_url(url)
    kw: dict[str, Any] = {"host": u.host or "127.0.0.1", "port": u.port or 5432, "user": u.username or "postgres",
                          "dbname": u.database or "postgres", "autocommit": True}
    if u.password:
        kw["password"] = u.password
    return kw


def prepare_database(admin_url: str, executions: int, keep: bool) -> tuple[str, bool]:
    """URL of the benchmark database; True when it already held the data (a kept database)."""
    kw = admin_kwargs(admin_url)
    with psycopg.connect(**kw) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DB_NAME,)).fetchone()
        if exists and not keep:
            conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(DB_NAME)))
        if not exists or not keep:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DB_NAME)))
    url = make_url(admin_url).set(database=DB_NAME).render_as_string(hide_password=False)
    if exists and keep:
        store = Store.open(url)
        with store.transaction() as c:
            n = c.execute(sa.select(sa.func.count()).select_from(t.executions)).scalar_one()
        store.close()
        if n >= executions:
            return url, True
    return url, False


def load(url: str, executions: int) -> None:
    store = Store.open(url)
    for i in range(executions):
        t0 = time.perf_counter()
        w = synthetic_execution(SynthConfig(seed=100 + i), run_id="bench", task_id=f"bench-task-{i}")
        tokens = store.apply(w.events).tokens
        log(f"loaded execution {i + 1}/{executions}: {tokens:,} tokens in {time.perf_counter() - t0:.1f} s")
    store.close()


def pick_targets(url: str) -> dict[str, Any]:
    """A 300-call execution for the tree, and the call whose input is closest to 128K tokens for the audit."""
    store = Store.open(url)
    with store.transaction() as conn:
        e = t.executions.c
        ex = conn.execute(sa.select(e.execution_id, e.n_calls, e.n_nodes, e.n_tokens).order_by(e.started_at)).first()
        c = t.calls.c
        call = conn.execute(sa.select(c.call_id, c.input_len)
                            .order_by(sa.func.abs(c.input_len - AUDIT_CONTEXT)).limit(1)).first()
        key, _ = create_key(conn, "bench", "read")
    stats = store.stats()
    store.close()
    assert ex is not None and call is not None
    return {"execution_id": ex.execution_id, "n_calls": ex.n_calls, "n_nodes": ex.n_nodes,
            "call_id": call.call_id, "input_len": call.input_len, "key": key, "stats": stats}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """``sapwood serve`` (uvicorn workers) in a child process."""

    def __init__(self, url: str, workers: int, env: dict[str, str]) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-c", "from sapwood.platform.cli import main; main()", "serve", "--no-migrate",
               "--host", "127.0.0.1", "--port", str(self.port), "--workers", str(workers), "--log-level", "warning"]
        self.proc = subprocess.Popen(cmd, env={**os.environ, "SAPWOOD_DATABASE_URL": url, **env})
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.base}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError("the API server did not become healthy within 60 s")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def timed_get(url: str, headers: dict[str, str]) -> tuple[float, httpx.Response]:
    t0 = time.perf_counter()
    r = httpx.get(url, headers=headers, timeout=60)
    return (time.perf_counter() - t0) * 1000, r


def wrk(url: str, key: str, connections: int, duration: int, script: Path) -> dict[str, Any]:
    threads = max(1, min(connections, 2))
    cmd = ["wrk", "-t", str(threads), "-c", str(connections), "-d", f"{duration}s", "--timeout", "10s",
           "-H", f"Authorization: Bearer {key}", "-s", str(script), url]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    raw = json.loads(out.strip().splitlines()[-1])
    seconds = raw["duration_us"] / 1e6
    return {
        "concurrency": connections,
        "requests": raw["requests"],
        "requests_per_s": round(raw["requests"] / seconds, 1),
        "p50_ms": round(raw["p50_us"] / 1000, 2),
        "p90_ms": round(raw["p90_us"] / 1000, 2),
        "p99_ms": round(raw["p99_us"] / 1000, 2),
        "max_ms": round(raw["max_us"] / 1000, 2),
        "mb_per_s": round(raw["bytes"] / seconds / 1e6, 1),
        "non_2xx": raw["non_2xx"],
        "socket_errors": raw["socket_errors"],
    }


def run_endpoints(server: Server, endpoints: dict[str, str], key: str, levels: list[int], duration: int,
                  script: Path) -> dict[str, list[dict[str, Any]]]:
    headers = {"Authorization": f"Bearer {key}"}
    out: dict[str, list[dict[str, Any]]] = {}
    for name, path in endpoints.items():
        for _ in range(16):  # warm every worker (connection pools, caches)
            r = httpx.get(server.base + path, headers=headers, timeout=60)
            r.raise_for_status()
        out[name] = []
        for c in levels:
            res = wrk(server.base + path, key, c, duration, script)
            log(f"{name:>12} c={c:<3} p50 {res['p50_ms']:7.2f} ms  p99 {res['p99_ms']:7.2f} ms  "
                f"{res['requests_per_s']:8.1f} req/s  {res['mb_per_s']:6.1f} MB/s  non-2xx {res['non_2xx']}")
            out[name].append(res)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--admin-url", default=os.environ.get("SAPWOOD_BENCH_DATABASE_URL")
                   or os.environ.get("SAPWOOD_TEST_DATABASE_URL"))
    p.add_argument("--executions", type=int, default=3, help="~700K-token executions to store")
    p.add_argument("--workers", type=int, default=2, help="uvicorn workers")
    p.add_argument("--duration", type=int, default=10, help="seconds per wrk run")
    p.add_argument("--concurrency", default="1,4,16", help="comma-separated client counts")
    p.add_argument("--uncached", action=argparse.BooleanOptionalAction, default=True,
                   help="also measure with the response cache off (SAPWOOD_API_CACHE_BYTES=0)")
    p.add_argument("--only", default="", help="comma-separated subset of tree,audit,audit_binary,tree_summary")
    p.add_argument("--keep", action="store_true", help="keep (and reuse) the benchmark database")
    args = p.parse_args()
    if not args.admin_url:
        sys.exit("no PostgreSQL: pass --admin-url or set SAPWOOD_TEST_DATABASE_URL (python scripts/services.py start)")
    if shutil.which("wrk") is None:
        sys.exit("wrk is not installed (Debian/Ubuntu: apt-get install wrk)")
    levels = [int(x) for x in args.concurrency.split(",")]

    url, reused = prepare_database(args.admin_url, args.executions, args.keep)
    if not reused:
        load(url, args.executions)
    target = pick_targets(url)
    stats = target["stats"]
    log(f"store: {stats['tree_tokens']:,} tree tokens, {stats['calls']} calls, {stats['nodes']} nodes; tree of "
        f"{target['n_calls']} calls / {target['n_nodes']} nodes; audit of a {target['input_len']:,}-token input")
    key = target["key"]
    eid, cid = target["execution_id"], target["call_id"]
    endpoints = {
        "tree": f"/v1/executions/{eid}/tree",
        "audit": f"/v1/calls/{cid}/audit",
        "audit_binary": f"/v1/calls/{cid}/input.bin",
        "tree_summary": f"/v1/executions/{eid}/tree/summary",
    }
    if args.only:
        endpoints = {k: v for k, v in endpoints.items() if k in args.only.split(",")}
    headers = {"Authorization": f"Bearer {key}"}
    result: dict[str, Any] = {
        "benchmark": "api",
        "tokens_stored": stats["tree_tokens"],
        "executions": args.executions,
        "tree": {"execution_id": eid, "calls": target["n_calls"], "nodes": target["n_nodes"]},
        "audit": {"call_id": cid, "input_tokens": target["input_len"]},
        "workers": args.workers,
        "duration_s": args.duration,
        "cpus": os.cpu_count(),
        "load_average_before": [round(x, 2) for x in os.getloadavg()],
    }
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "report.lua"
        script.write_text(WRK_SCRIPT)
        server = Server(url, args.workers, {})
        try:
            cold = {name: round(timed_get(server.base + path, headers)[0], 1) for name, path in endpoints.items()}
            if "audit" in endpoints:
                audit = httpx.get(server.base + endpoints["audit"], headers=headers, timeout=60)
                result["audit"].update(verified=audit.json()["verified"], response_bytes=len(audit.content))
            if "tree" in endpoints:
                tree = httpx.get(server.base + endpoints["tree"], headers=headers, timeout=60)
                result["tree"].update(response_nodes=len(tree.json()["nodes"]), response_bytes=len(tree.content))
            result["first_request_ms"] = cold
            result["cached"] = run_endpoints(server, endpoints, key, levels, args.duration, script)
        finally:
            server.stop()
        if args.uncached:
            server = Server(url, args.workers, {"SAPWOOD_API_CACHE_BYTES": "0"})
            try:
                subset = {k: endpoints[k] for k in ("tree", "audit") if k in endpoints}
                result["uncached"] = run_endpoints(server, subset, key, levels, args.duration, script)
            finally:
                server.stop()
    at16 = {name: next((r for r in runs if r["concurrency"] == 16), None) for name, runs in result["cached"].items()}
    result["targets"] = {
        f"{name}_p99_ms_at_16": {"value": r["p99_ms"], "target": TARGET_P99_MS, "met": r["p99_ms"] <= TARGET_P99_MS}
        for name, r in at16.items() if r is not None and name in ("tree", "audit")
    }
    result["all_targets_met"] = all(v["met"] for v in result["targets"].values())
    result["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    if not args.keep:
        with psycopg.connect(**admin_kwargs(args.admin_url)) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(DB_NAME)))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
