"""The gateway's added latency as users run it: three processes, side by side in one run.

The stand-in upstream (``tests/support/stub_upstream.py`` under uvicorn) and ``sapwood gateway`` each run
in their own process; this process is the client. At each concurrency level the client alternates
blocks of chained calls direct to the stand-in and through the gateway (ABBA), so both see the same
machine load; the gateway's CPU per call is its process's CPU time (user + system, all its threads:
the event loop and the background recorder) over the calls it served.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_ready(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2).status_code < 500:
                return
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer within {timeout_s} s")


@contextlib.contextmanager
def _process(args: list[str], ready_url: str, log: Path, env: dict[str, str] | None = None
             ) -> Iterator[psutil.Process]:
    with log.open("wb") as out:
        proc = subprocess.Popen(args, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
        try:
            _wait_ready(ready_url, proc)
            yield psutil.Process(proc.pid)
        finally:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@dataclass
class Gateway:
    """One ``sapwood gateway`` process: its name in the table, URL and process."""

    name: str
    url: str
    proc: psutil.Process


@contextlib.contextmanager
def stand_in_and_gateways(ack: str, tmp: Path, variants: dict[str, str | None]
                          ) -> Iterator[tuple[str, psutil.Process, list[Gateway]]]:
    """The stand-in upstream and one ``sapwood gateway --ack=ACK`` per variant (name -> the PYTHONPATH its
    process imports Sapwood from; None: this checkout's), each its own process with its own embedded
    SQLite store under ``tmp``; yields (upstream URL, upstream process, gateways)."""
    up_port = _free_port()
    upstream = f"http://127.0.0.1:{up_port}"
    stand_in = [sys.executable, "-m", "uvicorn", "--factory", "tests.support.stub_upstream:stub_app",
                "--port", str(up_port), "--log-level", "warning", "--no-access-log"]
    with contextlib.ExitStack() as stack:
        up_proc = stack.enter_context(_process(stand_in, upstream + "/docs", tmp / "stand_in.log"))
        gateways = []
        for k, (name, pythonpath) in enumerate(variants.items()):
            port = _free_port()
            url = f"http://127.0.0.1:{port}"
            args = [sys.executable, "-m", "sapwood.platform.cli", "gateway", "--upstream", upstream,
                    "--port", str(port), "--database-url", f"sqlite:///{tmp / f'gateway{k}.db'}", "--ack", ack,
                    "--run-id", "bench"]
            env = {"PYTHONPATH": pythonpath} if pythonpath else None
            proc = stack.enter_context(_process(args, url + "/health", tmp / f"gateway{k}.log", env))
            gateways.append(Gateway(name, url, proc))
        yield upstream, up_proc, gateways


async def _block(base: str, sessions: int, calls: int, gateway: bool, tag: str, errors: list[str]
                 ) -> tuple[list[float], float]:
    """``calls`` chained completions per session, ``sessions`` at once, on fresh connections (a server closes
    a connection idle for 5 s: one kept from an earlier block may be closed as it is reused); each
    session's first call opens its connection and is not counted. A call not answered 200 is appended
    to ``errors`` (its latency still counts). Returns (per-call seconds, wall seconds)."""
    lat: list[float] = []
    limits = httpx.Limits(max_connections=sessions, max_keepalive_connections=sessions)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:

        async def session(k: int, calls: int) -> list[float]:
            prompt, mine = [7, 8, 9, k % 50 + 10], []
            url = f"{base}/s/{tag}-{k}/v1/completions" if gateway else f"{base}/v1/completions"
            for _ in range(calls):
                t0 = time.perf_counter()
                r = await client.post(url, json={"prompt": prompt, "max_tokens": 4, "return_token_ids": True})
                mine.append(time.perf_counter() - t0)
                if r.status_code != 200:  # counted and shown, never hidden: the session goes on
                    errors.append(f"{r.status_code}: {r.text[:300]}")
                    continue
                choice = r.json()["choices"][0]
                prompt = [*choice["prompt_token_ids"], *choice["token_ids"], 3]
            return mine

        await asyncio.gather(*(session(k, 1) for k in range(sessions)))
        t0 = time.perf_counter()
        for mine in await asyncio.gather(*(session(k, calls) for k in range(sessions))):
            lat += mine
        return lat, time.perf_counter() - t0


def _cpu_s(p: psutil.Process) -> float:
    t = p.cpu_times()
    return float(t.user + t.system)


@dataclass
class PathFigures:
    """One path's figures at one level: latencies (s), wall (s), CPU (s) of the gateway (if any) and the client."""

    name: str
    lat: list[float] = field(default_factory=list)
    wall: float = 0.0
    gateway_cpu: float = 0.0
    client_cpu: float = 0.0
    errors: list[str] = field(default_factory=list)


async def measure(upstream: str, gateways: list[Gateway], sessions: int, calls: int, rounds: int = 4
                  ) -> list[PathFigures]:
    """``rounds`` blocks of each path (direct, then each gateway) at ``sessions`` concurrent sessions, the
    order reversed every other round (ABBA); about ``calls`` calls in all per path."""
    per = max(2, calls // sessions // rounds)
    paths = [PathFigures("direct"), *(PathFigures(g.name) for g in gateways)]
    targets: list[Gateway | None] = [None, *gateways]
    for rnd in range(rounds):
        order = list(range(len(paths))) if rnd % 2 == 0 else list(range(len(paths)))[::-1]
        for i in order:
            g, path = targets[i], paths[i]
            g0, c0 = _cpu_s(g.proc) if g else 0.0, time.process_time()
            lat, wall = await _block(g.url if g else upstream, sessions, per, g is not None, f"c{sessions}r{rnd}",
                                     path.errors)
            path.lat += lat
            path.wall += wall
            path.gateway_cpu += (_cpu_s(g.proc) - g0) if g else 0.0
            path.client_cpu += time.process_time() - c0
    return paths


def _pct(xs: list[float], q: int) -> float:
    return statistics.quantiles(xs, n=100)[q - 1] * 1e3


HEADER = (f"{'sessions':>8} {'path':>10} {'p50 ms':>8} {'p99 ms':>8} {'+p50 ms':>8} {'+p99 ms':>8} "
          f"{'p50 x':>6} {'p99 x':>6} {'calls/s':>8} {'gw CPU ms/call':>15} {'client CPU ms/call':>19} {'errors':>6}")


def report(sessions: int, paths: list[PathFigures]) -> list[str]:
    """Rows: each path's p50 / p99, what it adds to direct (ms and as a ratio), calls/s, CPU per call."""
    d = paths[0]
    d50, d99 = _pct(d.lat, 50), _pct(d.lat, 99)
    rows = []
    for p in paths:
        p50, p99, n = _pct(p.lat, 50), _pct(p.lat, 99), len(p.lat)
        gw_cpu = f"{p.gateway_cpu / n * 1e3:.2f}" if p is not d else "-"
        rows.append(f"{sessions:>8} {p.name:>10} {p50:>8.2f} {p99:>8.2f} {p50 - d50:>8.2f} {p99 - d99:>8.2f} "
                    f"{p50 / d50:>6.2f} {p99 / d99:>6.2f} {n / p.wall:>8.0f} {gw_cpu:>15} "
                    f"{p.client_cpu / n * 1e3:>19.2f} {len(p.errors):>6}")
        if p.errors:
            rows.append(f"{'':>8} {p.name:>10} first error: {p.errors[0]}")
    return rows


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def run(calls: int, ack: str, levels: tuple[int, ...] = (1, 16, 64), variants: dict[str, str | None] | None = None
        ) -> None:
    """Start the stand-in and the gateways as processes and print each path's row per level."""
    variants = variants or {"gateway": None}
    with tempfile.TemporaryDirectory() as tmp, stand_in_and_gateways(ack, Path(tmp), variants) as (up, _, gws):
        print(f"--ack={ack}: stand-in, {len(gws)} gateway(s) and the client in their own processes; "
              f"load average {_load()} at the start", flush=True)
        print(HEADER, flush=True)
        for sessions in levels:
            for row in report(sessions, asyncio.run(measure(up, gws, sessions, calls))):
                print(row, flush=True)
        print(f"load average {_load()} at the end", flush=True)
