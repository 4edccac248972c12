"""Where a cold audit's time goes in-process: the app over ASGI (no HTTP server), response cache off.

Loads a few small executions into the test PostgreSQL database (``SAPWOOD_TEST_DATABASE_URL``), times
``Store.reconstruct_input`` and ``GET /v1/calls/{id}/audit`` through the ASGI app for every call, then
profiles three passes (cProfile, event-loop thread only: work in the thread pool shows as the loop's
wait) and prints the key check's and FastAPI's dependency solving's share.

    python bench/profile_api_audit.py [--executions 6]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import os
import pstats
import statistics
import time

import httpx

from sapwood.api import ApiSettings, create_app
from sapwood.platform.store import Store
from tests.support.api_client import calls_of, load_executions, make_keys


def _ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000


async def _audits(store: Store, cids: list[str], headers: dict[str, str]) -> None:
    app = create_app(ApiSettings(api_cache_bytes=0), store=store)
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://bench") as c:
        for cid in cids[:5]:
            (await c.get(f"/v1/calls/{cid}/audit", headers=headers)).raise_for_status()
        times = []
        for cid in cids:
            t0 = time.perf_counter()
            (await c.get(f"/v1/calls/{cid}/audit", headers=headers)).raise_for_status()
            times.append(_ms(t0))
        print(f"ASGI audit p50 {statistics.median(times):.2f} ms over {len(times)} calls")
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(3):
            for cid in cids:
                await c.get(f"/v1/calls/{cid}/audit", headers=headers)
        prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats("deps.py|auth.py|solve_dependencies|epoll")
    print(f"profiled {3 * len(cids)} requests (times inflated by the profiler):")
    print(out.getvalue()[-4000:])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--executions", type=int, default=6)
    args = p.parse_args()
    store = Store.open(os.environ["SAPWOOD_TEST_DATABASE_URL"])
    writers = load_executions(store, args.executions, run_id="profile-audit")
    headers = make_keys(store).headers("read")
    cids = [c.event_id for w in writers for c in calls_of(w)]
    times = []
    for cid in cids:
        t0 = time.perf_counter()
        store.reconstruct_input(cid)
        times.append(_ms(t0))
    print(f"store reconstruct_input p50 {statistics.median(times):.2f} ms")
    asyncio.run(_audits(store, cids, headers))
    store.close()


if __name__ == "__main__":
    main()
