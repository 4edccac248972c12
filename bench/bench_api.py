"""REST API under real use: distinct requests over >= 100 executions, cold (uncached) and warm caches apart.

Loads ``--executions`` synthetic executions (forks, 3 compaction segments) into a fresh PostgreSQL
database, serves them with ``sapwood serve`` (``--workers`` uvicorn workers) and drives it with wrk
(a real HTTP load generator) at 1/4/16 connections. Every class of request cycles through its own
list of distinct URLs (each wrk thread starts at another place in the list):

* ``tree``: ``/v1/executions/{id}/tree`` of every execution;
* ``trajectory``: ``/v1/nodes/{leaf}/trajectory?limit=8192`` of every leaf;
* ``audit``: ``/v1/calls/{id}/audit`` of ``--audits-per-execution`` different calls per execution;
* ``audit_long``: audits of up to 100 different calls whose input is >= 64K tokens (in the
  ``--long-executions`` 700K-token executions);
* ``listing``: pages of ``/v1/executions`` (with and without filters) and ``/v1/executions/{id}/calls``,
  each with the cursor of its real previous page.

*Cold* is a server with the response cache off (every request rebuilds its answer from the store);
*warm* is a server with the cache on, after one pass over every URL (wrk reports the hit ratio it saw:
each worker keeps its own cache). The store's own reconstruction of the same audited contexts
(``Store.reconstruct_input``, in-process, one at a time) is measured in the same run, so the audit
target is a ratio measured side by side. Worker memory is the RSS of the uvicorn workers, idle and
after the load. The last stdout line is one JSON object.

    python bench/bench_api.py [--executions 100] [--calls 20] [--long-executions 2] [--workers 2] [--duration 6]
                              [--baseline REF]

``--baseline REF`` serves the code of git revision ``REF`` beside this tree's (same database, same
settings) and runs every cold wrk run against both, interleaved, so a change is measured before and
after side by side under the same load (``baseline_vs_cold``: p50 and p99 of both, and their ratios).

Needs ``wrk`` (Debian: ``apt-get install wrk``) and PostgreSQL (``--admin-url``,
``SAPWOOD_BENCH_DATABASE_URL`` or ``SAPWOOD_TEST_DATABASE_URL``; the database is dropped afterwards
unless ``--keep``, and a kept one is reused).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import resource
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psutil
import psycopg
import sqlalchemy as sa
from psycopg import sql
from rich.console import Console
from rich.progress import Progress
from sqlalchemy.engine import make_url

from sapwood.api.auth import create_key
from sapwood.api.cli import listen_socket
from sapwood.platform import schema as t
from sapwood.platform.store import Store
from sapwood.platform.synthetic import SynthConfig, synthetic_execution

DB_NAME = "sapwood_bench_api"
TARGET_P99_MS_AT_16 = 150.0
TARGET_AUDIT_VS_STORE = 2.0
CLASSES = ("tree", "trajectory", "audit", "audit_long", "listing")
LONG_CONTEXT = 64 * 1024  # audit_long: calls whose input is at least this many tokens

WRK_SCRIPT = """
local paths, counter = {}, 0
hits, misses = 0, 0  -- globals: done() reads them from every thread
setup = function(thread)
  table.insert(threads, thread)
  thread:set("tid", #threads)
end
threads = {}
init = function(args)
  for line in io.lines(args[1]) do paths[#paths + 1] = line end
  counter = (tid - 1) * math.floor(#paths / 2)
end
request = function()
  counter = counter + 1
  return wrk.format("GET", paths[(counter % #paths) + 1])
end
response = function(status, headers, body)
  local c = headers["X-Sapwood-Cache"] or headers["x-sapwood-cache"]
  if c == "hit" then hits = hits + 1 elseif c == "miss" then misses = misses + 1 end
end
done = function(summary, latency, requests)
  local h, m = 0, 0
  for _, th in ipairs(threads) do h = h + th:get("hits"); m = m + th:get("misses") end
  io.write(string.format(
    '{"requests": %d, "duration_us": %d, "bytes": %d, "non_2xx": %d, "socket_errors": %d, '
    .. '"p50_us": %d, "p90_us": %d, "p99_us": %d, "max_us": %d, "hits": %d, "misses": %d}\\n',
    summary.requests, summary.duration, summary.bytes, summary.errors.status,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max, h, m))
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


def load(url: str, executions: int, calls: int, long_executions: int) -> None:
    """``executions`` small ones and ``long_executions`` of the 700K-token default shape (contexts to ~230K)."""
    store = Store.open(url)
    with Progress(console=Console(stderr=True)) as progress:
        task = progress.add_task("loading executions", total=executions + long_executions)
        for i in range(executions + long_executions):
            cfg = SynthConfig(seed=100 + i, calls=calls, forks=3, fork_depth=2, segments=3,
                              status="timeout" if i % 4 == 3 else "success")
            if i >= executions:
                cfg = SynthConfig(seed=100 + i)
            store.apply(synthetic_execution(cfg, run_id="bench", task_id=f"task-{i % 10}").events)
            progress.advance(task)
    store.close()


def url_lists(url: str, base: str, key: str, audits_per_execution: int, seed: int = 0) -> dict[str, list[str]]:
    """The distinct URLs of each request class (listings with their real cursors)."""
    rng = random.Random(seed)
    store = Store.open(url, migrate=False)
    with store.transaction() as conn:
        e, c, n = t.executions.c, t.calls.c, t.nodes.c
        eids = [r[0] for r in conn.execute(sa.select(e.execution_id).order_by(e.started_at))]
        leaves = [r[0] for r in conn.execute(sa.select(n.node_id).where(n.is_leaf.is_(True)))]
        calls_by_ex: dict[str, list[str]] = {}
        long_calls = []
        for cid, eid, n_in in conn.execute(sa.select(c.call_id, c.execution_id, c.input_len)):
            if n_in >= LONG_CONTEXT:
                long_calls.append(cid)
            else:
                calls_by_ex.setdefault(eid, []).append(cid)
    store.close()
    audits = [cid for eid in eids if eid in calls_by_ex
              for cid in rng.sample(calls_by_ex[eid], min(audits_per_execution, len(calls_by_ex[eid])))]
    listing: list[str] = []
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=base, headers=headers, timeout=60) as http:
        starts = ["/v1/executions?limit=20", "/v1/executions?limit=20&status=success&order=asc",
                  "/v1/executions?limit=10&task_id=task-3", *(f"/v1/executions/{eid}/calls?limit=10"
                                                              for eid in eids[:: max(1, len(eids) // 20)])]
        for start in starts:
            path: str | None = start
            for _ in range(5):  # up to 5 pages of each listing
                assert path is not None
                listing.append(path)
                cursor = http.get(path).raise_for_status().json()["next_cursor"]
                if cursor is None:
                    break
                path = start + "&cursor=" + cursor
    out = {"tree": [f"/v1/executions/{x}/tree" for x in eids],
           "trajectory": [f"/v1/nodes/{x}/trajectory?limit=8192" for x in leaves],
           "audit": [f"/v1/calls/{x}/audit" for x in audits],
           "audit_long": [f"/v1/calls/{x}/audit" for x in rng.sample(long_calls, min(100, len(long_calls)))],
           "listing": listing}
    for paths in out.values():
        rng.shuffle(paths)
    return out


def store_reconstruction_ms(url: str, call_ids: list[str]) -> list[float]:
    """In-process time of ``Store.reconstruct_input`` for each call (the store's own rebuild of the context)."""
    store = Store.open(url, migrate=False)
    store.reconstruct_input(call_ids[0])  # connect
    out = []
    for cid in call_ids:
        t0 = time.perf_counter()
        store.reconstruct_input(cid)
        out.append((time.perf_counter() - t0) * 1000)
    store.close()
    return out


def store_p50_ms(url: str, call_ids: list[str]) -> float:
    """Median of :func:`store_reconstruction_ms` over ``call_ids``."""
    return statistics.median(store_reconstruction_ms(url, call_ids))


class Server:
    """``sapwood serve`` (uvicorn workers) in a child process."""

    def __init__(self, url: str, workers: int, env: dict[str, str], label: str = "") -> None:
        self.label = label
        sock = listen_socket("127.0.0.1", 0)
        self.port = sock.getsockname()[1]
        sock.close()
        self.base = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-c", "from sapwood.platform.cli import main; main()", "serve", "--no-migrate",
               "--host", "127.0.0.1", "--port", str(self.port), "--workers", str(workers), "--log-level", "warning"]
        self.proc = subprocess.Popen(cmd, env={**os.environ, "SAPWOOD_DATABASE_URL": url, **env})
        self.workers = workers
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.base}/healthz", timeout=1).status_code == 200 and len(self._workers()) >= workers:
                    time.sleep(1.0)
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError("the API server did not become healthy within 90 s")

    def _workers(self) -> list[psutil.Process]:
        main = psutil.Process(self.proc.pid)
        if self.workers == 1:
            return [main]
        return [p for p in main.children(recursive=True) if "spawn_main" in " ".join(p.cmdline())]

    def worker_rss_mb(self) -> list[float]:
        return sorted(round(p.memory_info().rss / 2**20, 1) for p in self._workers())

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def wrk(base: str, key: str, paths_file: Path, connections: int, duration: float, script: Path) -> dict[str, Any]:
    threads = max(1, min(connections, 2))
    cmd = ["wrk", "-t", str(threads), "-c", str(connections), "-d", f"{max(1, round(duration))}s", "--timeout", "10s",
           "-H", f"Authorization: Bearer {key}", "-s", str(script), base, "--", str(paths_file)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"wrk failed ({done.returncode}): {done.stderr[-2000:]}{done.stdout[-2000:]}")
    raw = json.loads(done.stdout.strip().splitlines()[-1])
    seconds = raw["duration_us"] / 1e6
    answered = raw["hits"] + raw["misses"]
    return {
        "clients": connections, "requests": raw["requests"], "requests_per_s": round(raw["requests"] / seconds, 1),
        "p50_ms": round(raw["p50_us"] / 1000, 2), "p90_ms": round(raw["p90_us"] / 1000, 2),
        "p99_ms": round(raw["p99_us"] / 1000, 2), "max_ms": round(raw["max_us"] / 1000, 2),
        "mb_per_s": round(raw["bytes"] / seconds / 1e6, 1), "non_2xx": raw["non_2xx"],
        "socket_errors": raw["socket_errors"],
        "cache_hit_ratio": round(raw["hits"] / answered, 3) if answered else None,
    }


def _cpu_s(processes: list[psutil.Process]) -> dict[int, float]:
    out = {}
    for proc in processes:
        try:
            t = proc.cpu_times()
        except psutil.Error:
            continue
        out[proc.pid] = t.user + t.system
    return out


def database_backends() -> list[psutil.Process]:
    """The PostgreSQL server processes serving connections to the benchmark database (on this machine)."""
    out = []
    for proc in psutil.process_iter(["name", "cmdline"]):
        title = " ".join(proc.info["cmdline"] or ())
        if title.startswith("postgres:") and f" {DB_NAME} " in title:
            out.append(proc)
    return out


def measured_wrk(server: Server, key: str, path: Path, connections: int, duration: float,
                 script: Path) -> dict[str, Any]:
    """:func:`wrk`, plus the CPU time it cost per request: the API workers', the database backends' and
    wrk's own (ms), and the p50 that this much CPU allows at this many clients on this machine's cores
    (``clients × CPU per request ÷ cores``: the queue's floor when every core served this benchmark)."""
    workers = server._workers()
    api0, db0 = _cpu_s(workers), _cpu_s(database_backends())
    child0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    res = wrk(server.base, key, path, connections, duration, script)
    child1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    api1, db1 = _cpu_s(workers), _cpu_s(database_backends())
    n = max(res["requests"], 1)
    api = sum(api1[p] - api0.get(p, 0.0) for p in api1) * 1000 / n
    db = sum(db1[p] - db0.get(p, 0.0) for p in db1) * 1000 / n
    client = ((child1.ru_utime + child1.ru_stime) - (child0.ru_utime + child0.ru_stime)) * 1000 / n
    res["cpu_ms_per_request"] = {"api": round(api, 2), "database": round(db, 2), "wrk": round(client, 2)}
    res["cpu_floor_p50_ms"] = round(connections * (api + db + client) / (os.cpu_count() or 1), 2)
    return res


def run_classes(servers: list[Server], key: str, files: dict[str, Path], levels: list[int], duration: float,
                script: Path, rounds: int = 1, beside: dict[str, Callable[[], float]] | None = None,
                ) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """wrk over every class and client count, ``rounds`` times, against each server in turn (the order
    alternating from one run to the next, so that neither server always follows the other): label →
    class → one entry per client count (with ``rounds`` > 1: the median round by p99, the others' p50
    and p99 in ``rounds``). ``beside[name]()`` runs before each round of that class at the first client
    count (the store's own rebuild, measured at the same moment); its values are under ``"store"``."""
    out: dict[str, dict[str, list[dict[str, Any]]]] = {s.label: {} for s in servers}
    out["store"] = {}
    turn = 0
    for name, path in files.items():
        for c in levels:
            seen: dict[str, list[dict[str, Any]]] = {s.label: [] for s in servers}
            for _ in range(rounds):
                if beside and name in beside and c == levels[0]:
                    out["store"].setdefault(name, []).append({"p50_ms": beside[name]()})
                for server in servers[::-1] if turn % 2 else servers:
                    res = measured_wrk(server, key, path, c, duration, script)
                    cpu = res["cpu_ms_per_request"]
                    log(f"{server.label:>8} {name:>10} c={c:<3} p50 {res['p50_ms']:7.2f} ms  p99 {res['p99_ms']:7.2f} "
                        f"ms  {res['requests_per_s']:7.1f} req/s  cpu/req api {cpu['api']:.2f} db {cpu['database']:.2f}"
                        f" wrk {cpu['wrk']:.2f} ms  hits {res['cache_hit_ratio']}  non-2xx {res['non_2xx']}  "
                        f"load {os.getloadavg()[0]:.1f}")
                    seen[server.label].append(res)
                turn += 1
            for label, results in seen.items():
                ordered = sorted(results, key=lambda r: r["p99_ms"])
                chosen = dict(ordered[len(ordered) // 2])
                if rounds > 1:
                    chosen["rounds"] = [{"p50_ms": r["p50_ms"], "p99_ms": r["p99_ms"]} for r in results]
                out[label].setdefault(name, []).append(chosen)
    return out


def checkout(ref: str, into: Path) -> dict[str, str]:
    """The tree of git revision ``ref`` under ``into``; the environment that imports its code."""
    root = Path(__file__).resolve().parent.parent
    archive = subprocess.run(["git", "-C", str(root), "archive", ref], capture_output=True, check=True).stdout
    into.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return {"PYTHONPATH": os.pathsep.join(str(p) for p in sorted(into.glob("*/src")))}


def compared(result: dict[str, Any]) -> dict[str, Any]:
    """Per class and client count: the baseline's figure ÷ this tree's (p50, p99: > 1 is faster now)."""
    out: dict[str, Any] = {}
    for name, runs in result["cold"].items():
        for new, old in zip(runs, result["baseline_cold"].get(name, []), strict=False):
            out[f"{name}_c{new['clients']}"] = {
                "p50_ms": [old["p50_ms"], new["p50_ms"]], "p99_ms": [old["p99_ms"], new["p99_ms"]],
                "requests_per_s": [old["requests_per_s"], new["requests_per_s"]],
                "p50_speedup": round(old["p50_ms"] / max(new["p50_ms"], 1e-3), 2),
                "p99_speedup": round(old["p99_ms"] / max(new["p99_ms"], 1e-3), 2)}
    return out


def warm_up(server: Server, key: str, files: dict[str, Path], script: Path, passes: int) -> None:
    """Request every URL ``passes`` times over 8 connections (so both workers' caches see most of them)."""
    for path in files.values():
        n = len(path.read_text().splitlines())
        probe = wrk(server.base, key, path, 8, 1, script)
        seconds = max(1.0, min(30.0, passes * n / max(probe["requests_per_s"], 1.0)))
        wrk(server.base, key, path, 8, seconds, script)


def targets_of(result: dict[str, Any], phase: str, levels: list[int]) -> dict[str, Any]:
    """The goals met or not by the runs of ``phase`` (``cold``, ``baseline_cold``, ``warm``)."""
    out: dict[str, Any] = {}
    runs = result.get(phase, {})
    for name in ("audit", "audit_long"):
        if name in runs and phase != "warm":
            first = next(r for r in runs[name] if r["clients"] == levels[0])
            store = result["store_reconstruct_ms"][name]["rounds"]
            # each round's API p50 over the store's p50 measured just before it; the median of those
            api = [x["p50_ms"] for x in first.get("rounds", [first])]
            ratio = statistics.median(a / b for a, b in zip(api, store, strict=False))
            out[f"{phase}_{name}_p50_vs_store"] = {"value": round(ratio, 2), "target": TARGET_AUDIT_VS_STORE,
                                                   "met": ratio <= TARGET_AUDIT_VS_STORE}
    for name in CLASSES:
        at16 = next((r for r in runs.get(name, []) if r["clients"] == 16), None)
        if at16:
            out[f"{phase}_{name}_p99_ms_at_16"] = {"value": at16["p99_ms"], "target": TARGET_P99_MS_AT_16,
                                                   "met": at16["p99_ms"] <= TARGET_P99_MS_AT_16}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--admin-url", default=os.environ.get("SAPWOOD_BENCH_DATABASE_URL")
                   or os.environ.get("SAPWOOD_TEST_DATABASE_URL"))
    p.add_argument("--executions", type=int, default=100)
    p.add_argument("--calls", type=int, default=20, help="model calls per execution's main path")
    p.add_argument("--long-executions", type=int, default=2,
                   help="extra 700K-token executions, whose contexts of >= 64K tokens make the audit_long class")
    p.add_argument("--threads", type=int, default=None, help="SAPWOOD_API_THREADS of the workers")
    p.add_argument("--audits-per-execution", type=int, default=5)
    p.add_argument("--workers", type=int, default=2, help="uvicorn workers")
    p.add_argument("--duration", type=float, default=6, help="seconds per wrk run")
    p.add_argument("--concurrency", default="1,4,16", help="comma-separated client counts")
    p.add_argument("--only", default="", help=f"comma-separated subset of {','.join(CLASSES)}")
    p.add_argument("--keep", action="store_true", help="keep (and reuse) the benchmark database")
    p.add_argument("--cold-only", action="store_true", help="skip the warm (cache on) server")
    p.add_argument("--rounds", type=int, default=1, help="interleaved rounds of the cold runs (median reported)")
    p.add_argument("--baseline", default="", help="git revision to serve beside this tree in the cold runs, "
                   "interleaved with them (same data, same moment): the before/after of a change")
    args = p.parse_args()
    if not args.admin_url:
        sys.exit("no PostgreSQL: pass --admin-url or set SAPWOOD_TEST_DATABASE_URL (python scripts/services.py start)")
    levels = [int(x) for x in args.concurrency.split(",")]
    classes = [c for c in CLASSES if not args.only or c in args.only.split(",")]

    url, reused = prepare_database(args.admin_url, args.executions, args.keep)
    if not reused:
        load(url, args.executions, args.calls, args.long_executions)
    store = Store.open(url, migrate=False)
    with store.transaction() as conn:
        key, _ = create_key(conn, "bench", "read")
    stats = store.stats()
    store.close()
    log(f"store: {stats['executions']} executions, {stats['tree_tokens']:,} tree tokens, {stats['calls']} calls")
    result: dict[str, Any] = {
        "benchmark": "api", "executions": sum(stats["executions"].values()), "tokens_stored": stats["tree_tokens"],
        "calls": stats["calls"], "workers": args.workers, "duration_s": args.duration, "cpus": os.cpu_count(),
        "load_average_before": [round(x, 2) for x in os.getloadavg()],
    }
    if args.threads:
        os.environ["SAPWOOD_API_THREADS"] = str(args.threads)
    # one cursor secret for both servers: the listing URLs carry cursors the first server signed
    os.environ.setdefault("SAPWOOD_API_CURSOR_SECRET", secrets.token_urlsafe(32))
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "cycle.lua"
        script.write_text(WRK_SCRIPT)
        cold_server = Server(url, args.workers, {"SAPWOOD_API_CACHE_BYTES": "0"}, "cold")
        servers = [cold_server]
        try:
            if args.baseline:
                base_env = checkout(args.baseline, Path(tmp) / "baseline")
                servers.insert(0, Server(url, args.workers, {"SAPWOOD_API_CACHE_BYTES": "0", **base_env}, "baseline"))
                result["baseline"] = subprocess.run(["git", "rev-parse", "--short", args.baseline],
                                                    capture_output=True, text=True, check=True).stdout.strip()
            result["worker_rss_mb_idle"] = cold_server.worker_rss_mb()
            urls = url_lists(url, cold_server.base, key, args.audits_per_execution)
            result["distinct_urls"] = {k: len(v) for k, v in urls.items()}
            files = {}
            for name in classes:
                files[name] = Path(tmp) / f"{name}.txt"
                files[name].write_text("\n".join(urls[name]) + "\n")
            beside = {name: functools.partial(store_p50_ms, url, [u.split("/")[3] for u in urls[name][:200]])
                      for name in ("audit", "audit_long") if name in classes}
            runs = run_classes(servers, key, files, levels, args.duration, script, args.rounds, beside)
            result["store_reconstruct_ms"] = {
                name: {"p50": round(statistics.median(r["p50_ms"] for r in rs), 2),
                       "rounds": [round(r["p50_ms"], 2) for r in rs], "calls": len(urls[name][:200])}
                for name, rs in runs["store"].items()}
            result["cold"] = runs["cold"]
            if args.baseline:
                result["baseline_cold"] = runs["baseline"]
                result["baseline_vs_cold"] = compared(result)
            result["worker_rss_mb_after_cold"] = cold_server.worker_rss_mb()
        finally:
            for server in servers:
                server.stop()
        if not args.cold_only:
            warm_server = Server(url, args.workers, {}, "warm")
            try:
                warm_up(warm_server, key, files, script, passes=3)
                result["warm"] = run_classes([warm_server], key, files, levels, args.duration, script)["warm"]
                result["worker_rss_mb_after_warm"] = warm_server.worker_rss_mb()
            finally:
                warm_server.stop()
    targets = targets_of(result, "cold", levels)
    if args.baseline:
        result["baseline_targets"] = targets_of(result, "baseline_cold", levels)
    if not args.cold_only:
        targets.update(targets_of(result, "warm", levels))
    result["targets"] = targets
    result["all_targets_met"] = all(v["met"] for v in targets.values())
    result["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    if not args.keep:
        with psycopg.connect(**admin_kwargs(args.admin_url)) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(DB_NAME)))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
