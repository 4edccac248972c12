"""Where a served request's time goes under load: py-spy samples of ``sapwood serve``'s workers while wrk
drives one request class of ``bench_api.py`` (distinct URLs, response cache off), attributed to phases.

Each sample is given to the phase of its innermost frame that a rule names (database wait, psycopg,
SQLAlchemy, the key check, FastAPI's dependency solving, the thread-pool hop, routing, middleware,
HTTP parsing, JSON, ...); samples of idle threads and of the event loop waiting for I/O are counted
apart. Uses the database ``bench_api.py --keep`` leaves (loads it if missing).

    python bench/profile_api_load.py [--only audit] [--clients 16] [--seconds 8] [--workers 2]

Needs ``wrk`` and ``py-spy`` (the ``dev`` extra), and permission to attach to the workers (root, or
``kernel.yama.ptrace_scope=0``). The last stdout line is one JSON object: phase → share of samples.
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--admin-url", default=os.environ.get("SAPWOOD_BENCH_DATABASE_URL")
                   or os.environ.get("SAPWOOD_TEST_DATABASE_URL"))
    p.add_argument("--only", default="audit", choices=["tree", "trajectory", "audit", "listing"])
    p.add_argument("--executions", type=int, default=1000)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--seconds", type=int, default=8)
    p.add_argument("--workers", type=int, default=2)
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
        server = b.Server(url, args.workers, {"SAPWOOD_API_CACHE_BYTES": "0"}, "cold")
        try:
            urls = tmp / "urls.txt"
            urls.write_text("\n".join(b.url_lists(url, server.base, key, 2)[args.only]) + "\n")
            b.wrk(server.base, key, urls, args.clients, 2, script)  # warm: connections, prepared statements
            raw = [tmp / f"{w.pid}.txt" for w in server._workers()]
            spies = [subprocess.Popen(["py-spy", "record", "-p", path.stem, "-d", str(args.seconds), "-r", "200",
                                       "-f", "raw", "-o", str(path), "--nonblocking"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for path in raw]
            time.sleep(0.5)
            load = b.measured_wrk(server, key, urls, args.clients, args.seconds - 1, script)
            for spy in spies:
                spy.wait()
            phases = attribute([r for r in raw if r.exists()])
        finally:
            server.stop()
    for name, share in phases.items():
        b.log(f"{name:>48}: {share:.1%}" if isinstance(share, float) else f"{name:>48}: {share}")
    print(json.dumps({"profile": args.only, "clients": args.clients, "load": load, "phases": phases,
                      "load_average": [round(x, 2) for x in os.getloadavg()]}))


if __name__ == "__main__":
    main()
