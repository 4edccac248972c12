"""The recording gateway's costs, each measured side by side against an instant stand-in upstream.

    python bench/bench_gateway.py [--calls 200] [--only latency,cpu,bytes,memory,kill9]

* ``latency``: direct vs through the gateway over loopback HTTP as users run it: the stand-in and
  ``sapwood gateway`` each in its own process, this one the client (``bench/gateway_processes.py``);
  p50 / p99 per call, their ratios, calls/s and each process's CPU ms per call at 1 / 16 / 64
  concurrent sessions, per ack mode (embedded SQLite store behind the recorder).
* ``cpu``: the gateway's own cost per call at one session with ``--ack=async``, without sockets or
  threads: client -> gateway -> stand-in in-process (ASGI), events to a transport that drops them;
  wall p50 / p99 and CPU ms per call, direct vs through the gateway.
* ``bytes``: one 50-turn chat session; bytes per call stored by Sapwood (TITO events as encoded on
  the wire, and the SQLite store's growth) against the naive per-call JSON other gateways keep
  (messages + full prompt ids + output ids + log-probs each time).
* ``memory``: Python heap per open session (tracemalloc) after each of 200 sessions made 10 calls.
* ``kill9``: ``sapwood gateway --ack=durable`` over Kafka, killed with SIGKILL under load; answered
  calls vs stored after ingest (needs ``SAPWOOD_TEST_KAFKA_BOOTSTRAP``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import zstandard

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling gateway_processes

import gateway_processes
from sapwood.gateway.app import GatewayConfig, create_app
from sapwood.platform.codec import encode
from sapwood.platform.events import Event
from sapwood.platform.store import Store
from sapwood.rollout.transports import InProcessTransport, MemoryTransport, Transport
from tests.support.stub_upstream import stub_app

SECTIONS = ("latency", "cpu", "bytes", "memory", "kill9")


def _pct(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=100)[int(q) - 1] * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=200, help="calls per concurrency level (split over sessions)")
    ap.add_argument("--ack", action="append", choices=["async", "durable"], help="ack modes (default: both)")
    ap.add_argument("--baseline", help="latency: also run a gateway from this checkout (e.g. the previous commit)")
    ap.add_argument("--only", default=",".join(SECTIONS[:4]), help=f"sections, of {', '.join(SECTIONS)}")
    args = ap.parse_args()
    only = args.only.split(",")
    if "latency" in only:
        for ack in args.ack or ["async", "durable"]:
            variants: dict[str, str | None] = {"gateway": None}
            if args.baseline:  # a second gateway importing Sapwood from another checkout, side by side
                root = Path(args.baseline).resolve()
                variants = {"baseline": ":".join([*map(str, sorted(root.glob("*/src"))), str(root)]), "gateway": None}
            gateway_processes.run(args.calls, ack, variants=variants)
    if "cpu" in only:
        asyncio.run(_cpu(max(args.calls, 100)))
    if "bytes" in only:
        asyncio.run(_bytes(50))
        asyncio.run(_bytes_wide_ids(50))
    if "memory" in only:
        asyncio.run(_memory(200, 10))
    if "kill9" in only:
        _kill9()


class _DropTransport(Transport):
    """Acknowledges every event at once and keeps nothing (the gateway's cost without a store's)."""

    def send(self, event: Event) -> None:
        self._delivered(event, None)


def _asgi(app: Any, base: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=base, timeout=60)


async def _chained(client: httpx.AsyncClient, path: str, calls: int, max_tokens: int = 16
                   ) -> tuple[list[float], float]:
    """``calls`` chained completions (the prompt grows by each output + one id); per-call wall s, CPU s/call."""
    prompt, lat = [7, 8, 9, 10], []
    cpu0 = time.process_time()
    for _ in range(calls):
        t0 = time.perf_counter()
        r = await client.post(path, json={"prompt": prompt, "max_tokens": max_tokens, "return_token_ids": True})
        lat.append(time.perf_counter() - t0)
        choice = r.raise_for_status().json()["choices"][0]
        prompt = [*choice["prompt_token_ids"], *choice["token_ids"], 3]
    return lat, (time.process_time() - cpu0) / calls


async def _cpu(calls: int) -> None:
    upstream = _asgi(stub_app(), "http://stub")
    app = create_app(GatewayConfig(upstreams=["http://stub"], run_id="cpu", ack="async"), _DropTransport(),
                     client=upstream)
    async with app.router.lifespan_context(app):
        gateway = _asgi(app, "http://gw")
        await _chained(gateway, "/s/warm/v1/completions", 20)
        rows = []
        for rnd in range(4):  # ABBA: direct, gateway, gateway, direct
            order = ("direct", "gateway") if rnd % 2 == 0 else ("gateway", "direct")
            for which in order:
                c, path = (upstream, "/v1/completions") if which == "direct" else (gateway, f"/s/c{rnd}/v1/completions")
                rows.append((which, *await _chained(c, path, calls // 2)))
    d = [x for w, lat, _ in rows if w == "direct" for x in lat]
    g = [x for w, lat, _ in rows if w == "gateway" for x in lat]
    dc = statistics.mean(c for w, _, c in rows if w == "direct") * 1e3
    gc = statistics.mean(c for w, _, c in rows if w == "gateway") * 1e3
    print(f"in-process, 1 session, --ack=async, {len(g)} calls each, prompts up to {4 + 17 * (calls // 2)} tokens")
    print(f"{'':>8} {'p50 ms':>8} {'p99 ms':>8} {'CPU ms/call':>12}")
    print(f"{'direct':>8} {_pct(d, 50):>8.2f} {_pct(d, 99):>8.2f} {dc:>12.2f}")
    print(f"{'gateway':>8} {_pct(g, 50):>8.2f} {_pct(g, 99):>8.2f} {gc:>12.2f}")
    print(f"{'added':>8} {_pct(g, 50) - _pct(d, 50):>8.2f} {_pct(g, 99) - _pct(d, 99):>8.2f} {gc - dc:>12.2f}")


@contextlib.asynccontextmanager
async def _sized_gateway(stored: list[int]) -> AsyncIterator[tuple[httpx.AsyncClient, list[Event]]]:
    """A gateway recording into a fresh SQLite store; yields (client, every event sent); on exit appends to
    ``stored`` the store's growth after ``VACUUM`` and the bytes its pages hold (``dbstat``: page size minus
    unused bytes, tables and indexes), both minus the empty store's (bytes). The growth alone undercounts a
    short session: each table and index already has a root page, and rows that fit there add no page."""
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "bytes.db"
        store = Store.open(f"sqlite:///{db}")
        empty_used = _used_bytes(store)
        store.close()  # checkpoints the write-ahead log into the file
        empty = db.stat().st_size
        store = Store.open(f"sqlite:///{db}")
        wire: list[Event] = []
        inner = InProcessTransport(store, batch_size=64)
        sink = MemoryTransport(on_delivery=lambda e, _err: wire.append(e))
        app = create_app(GatewayConfig(upstreams=["http://stub"], run_id="bytes", ack="async"),
                         _Tee(inner, sink), client=_asgi(stub_app(), "http://stub"))
        async with app.router.lifespan_context(app):
            yield _asgi(app, "http://gw"), wire
        inner.close()
        with store.transaction() as conn:
            conn.exec_driver_sql("VACUUM")
        used = _used_bytes(store)
        store.close()
        stored += [db.stat().st_size - empty, used - empty_used]


def _used_bytes(store: Store) -> int:
    """Bytes the SQLite file's pages hold (``dbstat``: every table and index, free space left out)."""
    with store.transaction() as conn:
        return int(conn.exec_driver_sql("SELECT SUM(pgsize - unused) FROM dbstat").scalar_one())


async def _bytes(turns: int) -> None:
    """A 50-turn chat: each turn adds a user message (about 60 tokens) and gets 32 output tokens."""
    naive: list[bytes] = []
    stored: list[int] = []
    async with _sized_gateway(stored) as (gateway, wire):
        messages: list[dict[str, str]] = [{"role": "system", "content": "You are a careful coding agent."}]
        for k in range(turns):
            messages.append({"role": "user", "content": f"step {k}: run the tests and tell me what failed, "
                             "then propose the smallest fix"})
            body = {"model": "tiny", "messages": messages, "max_tokens": 32, "logprobs": True,
                    "return_token_ids": True}
            answer = (await gateway.post("/s/chat/v1/chat/completions", json=body)).raise_for_status().json()
            choice = answer["choices"][0]
            naive.append(json.dumps({
                "messages": messages, "prompt_token_ids": answer["prompt_token_ids"],
                "output_token_ids": choice["token_ids"], "text": choice["message"]["content"],
                "logprobs": [c["logprob"] for c in choice["logprobs"]["content"]],
            }).encode())
            messages.append(choice["message"])
        await gateway.post("/v1/sessions/chat/finish", json={"status": "success", "reward": 1.0})
    _print_bytes(f"{turns}-turn chat session (the stand-in's one id per character, ids 1-122)",
                 len(answer["prompt_token_ids"]), naive, wire, stored, turns)


async def _bytes_wide_ids(turns: int) -> None:
    """The same shape by token ids from a 151,936-id vocabulary (Qwen2's): 60 new prompt ids a turn."""
    rng = random.Random(0)
    naive: list[bytes] = []
    stored: list[int] = []
    prompt: list[int] = [rng.randrange(151_936) for _ in range(200)]
    async with _sized_gateway(stored) as (gateway, wire):
        for _ in range(turns):
            body = {"prompt": prompt, "max_tokens": 32, "logprobs": 1, "return_token_ids": True}
            choice = (await gateway.post("/s/ids/v1/completions", json=body)).raise_for_status().json()["choices"][0]
            naive.append(json.dumps({"prompt_token_ids": choice["prompt_token_ids"],
                                     "output_token_ids": choice["token_ids"],
                                     "logprobs": choice["logprobs"]["token_logprobs"]}).encode())
            prompt = [*choice["prompt_token_ids"], *choice["token_ids"], *(rng.randrange(151_936) for _ in range(60))]
    _print_bytes(f"{turns}-turn session by token ids (151,936-id vocabulary; naive JSON without text)",
                 len(choice["prompt_token_ids"]), naive, wire, stored, turns)


def _print_bytes(what: str, last_prompt: int, naive: list[bytes], wire: list[Event], stored: list[int],
                 turns: int) -> None:
    """Per call: the naive JSON, the events as encoded (plain, and with the codec's zstd flag), the store
    (``stored``: its growth and the bytes its pages hold, :func:`_sized_gateway`)."""
    zstd = zstandard.ZstdCompressor(level=3)  # Kafka's zstd level
    per_naive, per_db, per_used = sum(map(len, naive)) / turns, stored[0] / turns, stored[1] / turns
    per_wire = sum(len(encode(e)) for e in wire) / turns
    per_naive_z = sum(len(zstd.compress(n)) for n in naive) / turns
    per_wire_z = sum(len(encode(e, compress=True)) for e in wire) / turns
    print(f"{what}, bytes per call (last prompt {last_prompt} tokens):")
    print(f"  naive per-call JSON {per_naive:>10,.0f}")
    print(f"  Sapwood TITO events on the wire {per_wire:>10,.0f}  ({per_naive / per_wire:.1f}x smaller)")
    print(f"  Sapwood SQLite store growth (after VACUUM) {per_db:>10,.0f}  ({per_naive / per_db:.1f}x smaller)")
    print(f"  Sapwood SQLite bytes held in pages, indexes included {per_used:>10,.0f}  "
          f"({per_naive / per_used:.1f}x smaller)")
    print(f"  compressed: naive JSON each call zstd {per_naive_z:>10,.0f}; Sapwood events with the codec's zstd "
          f"flag {per_wire_z:>10,.0f}  ({per_naive_z / per_wire_z:.1f}x smaller; {per_naive / per_wire_z:.1f}x "
          "the uncompressed naive JSON)")


class _Tee(Transport):
    """Sends each event to ``inner`` and a copy to ``sink``; ``inner``'s deliveries are this one's."""

    def __init__(self, inner: Transport, sink: Transport) -> None:
        super().__init__()
        self.inner, self.sink = inner, sink
        inner.on_delivery = lambda e, err: self._delivered(e, err)

    def send(self, event: Event) -> None:
        self.sink.send(event)
        self.inner.send(event)

    def flush(self, timeout: float | None = None) -> None:
        self.inner.flush(timeout)


async def _memory(sessions: int, calls: int) -> None:
    app = create_app(GatewayConfig(upstreams=["http://stub"], run_id="mem", ack="async"), _DropTransport(),
                     client=_asgi(stub_app(), "http://stub"))
    async with app.router.lifespan_context(app):
        gateway = _asgi(app, "http://gw")
        await _chained(gateway, "/s/warm/v1/completions", calls)
        tracemalloc.start()
        before = tracemalloc.take_snapshot()
        for k in range(sessions):
            await _chained(gateway, f"/s/m{k}/v1/completions", calls)
        after = tracemalloc.take_snapshot()
        tracemalloc.stop()
        grown = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
        tokens = 4 + 17 * calls

        def top(st: Any) -> str:
            return f"{Path(st.traceback[0].filename).name}:{st.size_diff / sessions:,.0f}"

        biggest = sorted(after.compare_to(before, "filename"), key=lambda st: -st.size_diff)[:4]
        print(f"memory per open session ({sessions} sessions x {calls} calls, last context {tokens} tokens): "
              f"{grown / sessions:,.0f} bytes ({grown / sessions / tokens:,.1f} per token of the last context); "
              f"largest: {', '.join(top(st) for st in biggest)}")


def _kill9() -> None:
    from tests.support.gateway_kill import kill_under_load

    bootstrap = os.environ.get("SAPWOOD_TEST_KAFKA_BOOTSTRAP")
    if not bootstrap:
        print("kill9: skipped (SAPWOOD_TEST_KAFKA_BOOTSTRAP is unset)")
        return
    print(f"{'round':>5} {'answered':>8} {'stored':>6} {'lost':>4} {'dup':>3} {'in flight, stored':>18} {'calls/s':>8}")
    for rnd in range(3):
        with tempfile.TemporaryDirectory() as tmp:
            f = kill_under_load(bootstrap, f"sqlite:///{Path(tmp) / 'kill.db'}", Path(tmp), sessions=8,
                                kill_after=100)
        print(f"{rnd:>5} {f.answered:>8} {f.stored:>6} {f.lost:>4} {f.duplicated:>3} {f.stored_unanswered:>18} "
              f"{f.calls_per_s:>8.1f}")


if __name__ == "__main__":
    main()
