"""Added latency of the recording gateway: direct vs through it, against an instant stand-in upstream.

    python bench/bench_gateway.py [--calls 200]

Both paths run in this process (uvicorn threads), so the figures include the client's own cost on
both sides; the difference is the gateway's (proxying, recording into an embedded SQLite store,
the background recorder's batched commits). Prints p50 / p99 per call and calls/s side by side
at 1 / 16 / 64 concurrent sessions.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sapwood.gateway.app import GatewayConfig, create_app
from sapwood.platform.store import Store
from sapwood.rollout.transports import InProcessTransport
from tests.support.live_server import serve_in_thread
from tests.support.stub_upstream import stub_app


async def _load(base: str, sessions: int, calls: int, gateway: bool) -> tuple[list[float], float]:
    """``calls`` chained completions per session, ``sessions`` at once; returns per-call seconds, wall s."""
    lat: list[float] = []
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=sessions)) as client:

        async def session(k: int) -> None:
            prompt = [7, 8, 9, k % 50 + 10]
            for _ in range(calls):
                url = f"{base}/s/b{k}/v1/completions" if gateway else f"{base}/v1/completions"
                t0 = time.perf_counter()
                r = await client.post(url, json={"prompt": prompt, "max_tokens": 4, "return_token_ids": True})
                lat.append(time.perf_counter() - t0)
                choice = r.raise_for_status().json()["choices"][0]
                prompt = [*choice["prompt_token_ids"], *choice["token_ids"], 3]

        t0 = time.perf_counter()
        await asyncio.gather(*(session(k) for k in range(sessions)))
        return lat, time.perf_counter() - t0


def _pct(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=100)[int(q) - 1] * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--calls", type=int, default=200, help="calls per concurrency level (split over sessions)")
    ap.add_argument("--ack", action="append", choices=["async", "durable"], help="ack modes (default: both)")
    args = ap.parse_args()
    for ack in args.ack or ["async", "durable"]:
        _run(args.calls, ack)


def _run(calls: int, ack: str) -> None:
    with tempfile.TemporaryDirectory() as tmp, serve_in_thread(stub_app()) as upstream:
        store = Store.open(f"sqlite:///{Path(tmp) / 'bench.db'}")
        transport = InProcessTransport(store, batch_size=256)
        app = create_app(GatewayConfig(upstreams=[upstream], run_id="bench", ack=ack), transport)
        with serve_in_thread(app) as gw:
            print(f"--ack={ack}")
            print(
                f"{'sessions':>8} {'direct p50':>11} {'gw p50':>8} {'direct p99':>11} {'gw p99':>8} "
                f"{'direct c/s':>11} {'gw c/s':>8} {'added p50 ms':>13} {'added p99 ms':>13}"
            )
            for sessions in (1, 16, 64):
                per = max(2, calls // sessions)
                d, dw = asyncio.run(_load(upstream, sessions, per, False))
                g, gw_wall = asyncio.run(_load(gw, sessions, per, True))
                print(
                    f"{sessions:>8} {_pct(d, 50):>9.2f}ms {_pct(g, 50):>6.2f}ms {_pct(d, 99):>9.2f}ms "
                    f"{_pct(g, 99):>6.2f}ms {len(d) / dw:>11.0f} {len(g) / gw_wall:>8.0f} "
                    f"{_pct(g, 50) - _pct(d, 50):>13.2f} {_pct(g, 99) - _pct(d, 99):>13.2f}"
                )
            lags = sorted(app.state.gateway.recorder.lags)
            if lags:
                print(f"enqueue->commit lag (async risk window): p50 {_pct(lags, 50):.2f} ms, "
                      f"p99 {_pct(lags, 99):.2f} ms, max {lags[-1] * 1e3:.2f} ms over {len(lags)} events")
        transport.close()
        store.close()


if __name__ == "__main__":
    main()
