"""Where a served request's time goes under load: py-spy samples of ``sapwood serve``'s workers while wrk
drives one request class of ``bench_api.py`` (distinct URLs, response cache off), attributed to phases.

Each sample is given to the phase of its innermost frame that a rule names (database wait, psycopg,
SQLAlchemy, the key check, FastAPI's dependency solving, the thread-pool hop, routing, middleware,
HTTP parsing, JSON, ...); samples of idle threads and of the event loop waiting for I/O are counted
apart. Uses the database ``bench_api.py --keep`` leaves (loads it if missing).

    python bench/profile_api_load.py [--only audit] [--clients 16] [--seconds 8] [--workers 2]
                                     [--timings] [--no-spy] [--env SAPWOOD_X=Y ...]

``--timings`` also has the workers log each request's time split, their GC pauses and their event
loop's lag (``SAPWOOD_API_TIMING_DIR``, see ``sapwood.api.timing``) and reports, for the requests of
the measured window: requests per worker, p50/p99 of each phase inside the server against wrk's own
p50/p99 (what the server's time does not explain waited before the loop read the request, or after
it wrote the answer), what the slowest 1% of requests spent their time on, GC pauses and loop lag.
``--env`` passes settings to the server (to measure a candidate change under the same load).

Needs ``wrk`` and ``py-spy`` (the ``dev`` extra; not with ``--no-spy``), and permission to attach to
the workers (root, or ``kernel.yama.ptrace_scope=0``). The last stdout line is one JSON object.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import bench_api as b  # the benchmark's database, server and wrk driver (this file's sibling)
from sapwood.api.auth import create_key
from sapwood.platform.store import Store

#: (phase, regex on a frame "function (file:line)"): the first rule that names a frame, innermost first.
PHASES = (
    ("database wait (psycopg waiting for the server)", r"Connection\.wait \(psycopg"),
    ("psycopg (send, parse, adapt)", r"\(psycopg/"),
    ("JSON (orjson)", r"dump \(api/routes/__init__|orjson"),
    ("ETag (blake2b)", r"cached_json\.<locals>\.entry"),
    ("span decoding, numpy", r"span_encoding|numpy"),
    ("connection pool", r"sqlalchemy/pool|_ping_if_idle|_returned"),
    ("SQLAlchemy (execute, results)", r"\(sqlalchemy/"),
    ("key check", r"\(api/auth\.py|RequireScope"),
    ("FastAPI dependency solving", r"solve_dependencies|request_params_to_args|fastapi/dependencies"),
    ("route code (queries)", r"\(api/queries/|platform/storage/|api/routes/"),
    ("thread-pool hop (anyio, thread wake-ups)", r"anyio|run_in_threadpool|threading\.py|queue\.py"),
    ("routing", r"matches|_match|compile_path|Router\.__call__"),
    ("middleware", r"api/middleware|starlette/middleware|fastapi/middleware|_body_limit|telemetry|_exception_handler"),
    ("HTTP (uvicorn, httptools)", r"uvicorn/protocols|http_protocol|httptools|starlette/responses"),
    ("event loop", r"asyncio|uvloop|selectors"),
)
IDLE = (r"Condition\.wait \(threading", r"Queue\.get \(queue", r"select \(selectors", r"^Runner\.run \(asyncio")


def attribute(raw_files: list[Path]) -> dict[str, float]:
    """Share of the non-idle samples of each phase (and ``idle_samples``, ``samples``) in py-spy raw output."""
    counts: collections.Counter[str] = collections.Counter()
    idle = 0
    for path in raw_files:
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            stack, n_text = line.rsplit(" ", 1)
            n = int(n_text)
            frames = stack.split(";")
            if any(re.search(rx, frames[-1]) for rx in IDLE):
                idle += n
                continue
            phase = next((name for f in reversed(frames) for name, rx in PHASES if re.search(rx, f)), "other")
            counts[phase] += n
    total = sum(counts.values()) or 1
    out: dict[str, float] = {k: round(v / total, 3) for k, v in counts.most_common()}
    out["samples"] = total
    out["idle_samples"] = idle
    return out


PHASE_FIELDS = ("app", "queue", "key", "hop", "thread", "back", "pool", "db", "json", "gc")


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3) if ordered else 0.0


def timing_report(directory: Path, since: float, until: float) -> dict[str, object]:
    """Summary of the ``api-timing-<pid>.jsonl`` records (see ``sapwood.api.timing``) between two wall times."""
    by_worker: dict[str, list[dict[str, float]]] = {}
    for path in sorted(directory.glob("api-timing-*.jsonl")):
        pid = path.stem.rsplit("-", 1)[1]
        by_worker[pid] = [r for r in map(json.loads, path.read_text().splitlines()) if since <= r["t"] <= until]
    reqs = [r for rs in by_worker.values() for r in rs if r["k"] == "req"]
    if not reqs:
        return {"requests": 0}
    slow = sorted(reqs, key=lambda r: r["app"])[-max(1, len(reqs) // 100):]
    out: dict[str, object] = {
        "requests": len(reqs),
        "requests_per_worker": {pid: sum(r["k"] == "req" for r in rs) for pid, rs in by_worker.items()},
        "phases_ms": {f: {"p50": _pct([r[f] for r in reqs], 0.5), "p99": _pct([r[f] for r in reqs], 0.99),
                          "mean": round(sum(r[f] for r in reqs) / len(reqs), 3)} for f in PHASE_FIELDS},
        "slowest_1pct_mean_ms": {f: round(sum(r[f] for r in slow) / len(slow), 3) for f in PHASE_FIELDS},
    }
    gcs = {pid: [r for r in rs if r["k"] == "gc"] for pid, rs in by_worker.items()}
    out["gc"] = {pid: {"pauses": len(g), "total_ms": round(sum(r["ms"] for r in g), 1),
                       "max_ms": max((r["ms"] for r in g), default=0.0),
                       "by_generation": dict(collections.Counter(str(r["gen"]) for r in g))} for pid, g in gcs.items()}
    lags = {pid: [r["ms"] for r in rs if r["k"] == "lag"] for pid, rs in by_worker.items()}
    out["loop_lag_ms"] = {pid: {"samples": len(v), "p50": _pct(v, 0.5), "p99": _pct(v, 0.99),
                                "max": max(v, default=0.0),
                                "busy_share": round(sum(v) / ((until - since) * 1000), 3)} for pid, v in lags.items()}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--admin-url", default=os.environ.get("SAPWOOD_BENCH_DATABASE_URL")
                   or os.environ.get("SAPWOOD_TEST_DATABASE_URL"))
    p.add_argument("--only", default="audit", choices=["tree", "trajectory", "audit", "listing"])
    p.add_argument("--executions", type=int, default=1000)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--seconds", type=int, default=8)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--timings", action="store_true", help="the workers' own time split, GC pauses and loop lag")
    p.add_argument("--no-spy", action="store_true", help="no py-spy sampling (its pauses perturb the timings)")
    p.add_argument("--env", action="append", default=[], help="SAPWOOD_X=Y setting of the server (repeatable)")
    args = p.parse_args()
    if not args.admin_url:
        sys.exit("no PostgreSQL: pass --admin-url or set SAPWOOD_TEST_DATABASE_URL")
    url, reused = b.prepare_database(args.admin_url, args.executions, True)
    if not reused:
        b.load(url, args.executions, 6, 0)
    store = Store.open(url, migrate=False)
    with store.transaction() as conn:
        key, _ = create_key(conn, "profile", "read")
    store.close()
    os.environ.setdefault("SAPWOOD_API_CURSOR_SECRET", secrets.token_urlsafe(32))
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        script = tmp / "cycle.lua"
        script.write_text(b.WRK_SCRIPT)
        env = {"SAPWOOD_API_CACHE_BYTES": "0", **dict(x.split("=", 1) for x in args.env)}
        if args.timings:
            env["SAPWOOD_API_TIMING_DIR"] = str(tmp / "timings")
        server = b.Server(url, args.workers, env, "cold")
        timings: dict[str, object] = {}
        phases: dict[str, float] = {}
        try:
            urls = tmp / "urls.txt"
            urls.write_text("\n".join(b.url_lists(url, server.base, key, 2)[args.only]) + "\n")
            b.wrk(server.base, key, urls, args.clients, 2, script)  # warm: connections, prepared statements
            raw = [tmp / f"{w.pid}.txt" for w in server._workers()]
            spies = [] if args.no_spy else [
                subprocess.Popen(["py-spy", "record", "-p", path.stem, "-d", str(args.seconds), "-r", "200", "-f",
                                  "raw", "-o", str(path), "--nonblocking"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for path in raw]
            time.sleep(0.5)
            since = time.time()
            load = b.measured_wrk(server, key, urls, args.clients, args.seconds - 1, script)
            until = time.time()
            for spy in spies:
                spy.wait()
            if spies:
                phases = attribute([r for r in raw if r.exists()])
            if args.timings:
                time.sleep(0.5)  # the workers flush their logs 5 times a second
                timings = timing_report(tmp / "timings", since, until)
        finally:
            server.stop()
    for name, share in phases.items():
        b.log(f"{name:>48}: {share:.1%}" if isinstance(share, float) else f"{name:>48}: {share}")
    if timings:
        b.log(json.dumps(timings, indent=1))
    print(json.dumps({"profile": args.only, "clients": args.clients, "env": args.env, "load": load, "phases": phases,
                      "timings": timings,
                      "load_average": [round(x, 2) for x in os.getloadavg()]}))


if __name__ == "__main__":
    main()
