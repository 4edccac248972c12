"""Store benchmark: apply throughput vs raw binary COPY, storage footprint, exact reconstruction latency.

One synthetic execution (~700K tokens, 300 model calls, 4 forks, 3 compaction segments,
observations of 1–3K tokens) is applied to a fresh PostgreSQL database. In the same run the
same span bytes are written with a raw binary ``COPY`` into a plain table, so the ratio is
measured side by side. Two more figures place it:

* warm apply: a second execution applied by the same process into the same store (what a
  long-running ingest sees; the first apply also pays for cold statement caches);
* store floor: exactly the rows apply stored, copied back into an empty store in one transaction
  with every index: the server's own share of apply, which no planner can go below on this
  schema and server. ``store_floor_vs_copy_ratio`` is therefore the best ratio reachable.
* hashing: the BLAKE2b work the issue's checks require whatever the planner — every array's span
  digest, and every token once more for the input-digest chain (``hash_ms``).
* free planner: apply as a planner that cost nothing could run it, measured on its own fresh
  database: apply's real look-ups, then the required hashing event by event; every 128 KiB of new
  span rows (framed beforehand) the stored-span check goes to a second connection, answered
  while the next rows are hashed, and the rows are sent, so the server stores spans while the
  client hashes; then the other tables' rows (made beforehand). ``free_planner_vs_copy_ratio``
  is about what a compiled planner pipelined against the server could reach on this schema and
  server.
* ``floor_and_lookups_vs_copy_ratio``: the store floor plus apply's look-ups, nothing else: about
  the envelope no planner on this schema and server gets past, whatever it hides under the writes
  (apply's look-up phase includes a few ms of Python a planner could save).

The last stdout line is a JSON object of the figures.

    python scripts/services.py start && source .services/env
    python bench/bench_store.py --database-url "$SAPWOOD_TEST_DATABASE_URL"
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import sqlalchemy as sa
from rich.console import Console

from pg_bench import drop_database, fresh_database, raw_copy, span_bytes
from sapwood.platform import schema as t
from sapwood.platform.events import ModelCall
from sapwood.platform.span_encoding import encode_span
from sapwood.platform.storage.postgres.applier import PostgresStoredState
from sapwood.platform.storage.postgres.bulkcopy import (
    BINARY_HEADER,
    BINARY_TRAILER,
    SPANS_COPY,
    frame_span,
    open_copy,
    send,
)
from sapwood.platform.storage.spans import existing_digests
from sapwood.platform.store import Store
from sapwood.platform.synthetic import SynthConfig, synthetic_execution
from sapwood.platform.tokens import digest_bytes, input_hasher

console = Console(stderr=True)


def _relation_bytes(store: Store) -> int:
    names = [tb.name for tb in t.metadata.sorted_tables]
    with store.transaction() as conn:
        return int(conn.execute(sa.text(
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'public' AND c.relkind = 'r' "
            "AND c.relname = ANY(:names)"), {"names": names}).scalar_one())


#: Tables apply writes, in the order it sends them.
_APPLY_TABLES = ("spans", "events", "executions", "nodes", "calls", "segments", "scores", "policy_versions")


def _export_rows(store: Store) -> dict[str, bytes]:
    """Every row apply stored, per table, as binary COPY data."""
    out: dict[str, bytes] = {}
    with store.transaction() as conn:
        raw = conn.connection.driver_connection
        for table in _APPLY_TABLES:
            with raw.cursor() as cur, cur.copy(f"COPY {table} TO STDOUT (FORMAT BINARY)") as cp:  # type: ignore[union-attr]
                out[table] = b"".join(bytes(block) for block in cp)
    return out


def _event_span_frames(events: list[Any]) -> list[tuple[list[np.ndarray], bytes]]:
    """Per event: its non-empty arrays (contiguous), and the binary COPY rows of the spans it adds
    to an empty store (first occurrence in the batch), framed as apply frames them."""
    seen: set[bytes] = set()
    out: list[tuple[list[np.ndarray], bytes]] = []
    for e in events:
        arrays = [np.ascontiguousarray(a) for a in e.array_fields().values() if a.size]
        parts: list[bytes] = []
        for arr in arrays:
            digest = digest_bytes(arr.data)
            if digest not in seen:
                seen.add(digest)
                frame_span(parts, digest, *encode_span(arr))
        out.append((arrays, b"".join(parts)))
    return out


#: Span bytes per stored-span check of the free planner (the best of 128 KiB, 256 KiB and 1 MiB here).
_FREE_CHECK_BYTES = 1 << 17


def _free_planner(url: str, events: list[Any], frames: list[tuple[list[np.ndarray], bytes]],
                  rows: dict[str, bytes]) -> float:
    """Seconds for apply with planning, framing and row building free (see the module docstring);
    ``frames`` from :func:`_event_span_frames`, ``rows`` from :func:`_export_rows`."""
    store = Store.open(url)
    conn = store.engine.connect()  # both connections established before the clock starts, as apply's is
    side = store.engine.connect()
    side.execute(sa.text("SELECT 1"))
    side.commit()
    checker = ThreadPoolExecutor(1)
    try:
        t0 = time.perf_counter()
        with conn.begin():
            PostgresStoredState(conn).prior_events([e.event_id for e in events])  # apply's duplicate check
            conn.execute(sa.select(t.executions).where(
                t.executions.c.execution_id.in_(sorted({e.execution_id for e in events if e.execution_id})))
                .with_for_update()).all()
            spans_copy, cp = open_copy(conn, SPANS_COPY)
            with spans_copy:
                cp.write(BINARY_HEADER)
                pending: list[bytes] = []
                digests: list[bytes] = []
                size = 0
                state = input_hasher()
                # A chunk's check runs on the side connection while the next chunk is hashed; the chunk is
                # sent once its check has answered.
                checking: tuple[Future[set[bytes]], list[bytes]] | None = None
                for arrays, framed in frames:
                    _required_hashing(arrays, state, digests)
                    pending.append(framed)
                    size += len(framed)
                    if size >= _FREE_CHECK_BYTES:
                        if checking is not None:
                            checking[0].result()
                            cp.write(b"".join(checking[1]))
                        # (The answer is empty here, a fresh store; a planner would drop the spans it names.)
                        checking = (checker.submit(existing_digests, side, digests), pending)
                        pending, digests, size = [], [], 0
                if checking is not None:
                    checking[0].result()
                    cp.write(b"".join(checking[1]))
                existing_digests(side, digests)
                cp.write(b"".join(pending) + BINARY_TRAILER)
            _copy_rows(conn, rows, _APPLY_TABLES[1:])
        return time.perf_counter() - t0
    finally:
        checker.shutdown()
        side.close()
        conn.close()
        store.close()


def _required_hashing(arrays: list[np.ndarray], state: Any, digests: list[bytes]) -> None:
    """The digest work apply cannot skip for contiguous ``arrays``, whatever the planner: each array's
    span digest (appended to ``digests``), and for token arrays the input-digest chain's pass over
    their tokens once more (``state``, an input hasher, copied and updated)."""
    for arr in arrays:
        digests.append(digest_bytes(arr.data))
        if arr.dtype == np.int32:
            state.copy().update(arr.data)


def _hash_seconds(events: list[Any]) -> float:
    """Seconds (best of 3) of :func:`_required_hashing` over every array of ``events``."""
    arrays = [np.ascontiguousarray(a) for e in events for a in e.array_fields().values() if a.size]
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        _required_hashing(arrays, input_hasher(), [])
        best = min(best, time.perf_counter() - t0)
    return best


def _copy_rows(conn: sa.Connection, rows: dict[str, bytes], tables: tuple[str, ...]) -> None:
    """One binary COPY per table of ``tables``, in order, of its ``rows`` (from :func:`_export_rows`)."""
    for table in tables:
        send(conn, (f"COPY {table} FROM STDIN (FORMAT BINARY)", rows[table]))


def _store_floor(url: str, rows: dict[str, bytes]) -> float:
    """Seconds to store exactly ``rows`` (from :func:`_export_rows`) into the empty, migrated store at
    ``url``: one transaction, one binary COPY per table in apply's order, every index maintained —
    the server's own share of apply, with no planning at all."""
    store = Store.open(url)
    try:
        t0 = time.perf_counter()
        with store.transaction() as conn:
            _copy_rows(conn, rows, _APPLY_TABLES)
        return time.perf_counter() - t0
    finally:
        store.close()


#: A current large vocabulary (Qwen2.5): ids need 18 bits, where the default synthetic 32K vocabulary needs 15.
LARGE_VOCAB = 151_936


def _near_128k(store: Store, calls: list[ModelCall]) -> list[ModelCall]:
    """The five calls whose inputs are closest to 128K tokens."""
    return sorted(calls, key=lambda c: abs(store_input_len(store, c.call_id) - 131_072))[:5]


def _reconstruct_ms(store: Store, calls: list[ModelCall], *, rounds: int) -> tuple[list[float], np.ndarray]:
    """Sorted milliseconds of ``rounds`` reconstructions of each call's input, and the last input rebuilt."""
    times: list[float] = []
    ids = np.zeros(0, dtype=np.int32)
    for _ in range(rounds):
        for c in calls:
            t0 = time.perf_counter()
            ids = store.reconstruct_input(c.call_id)
            times.append((time.perf_counter() - t0) * 1000)
    return sorted(times), ids


def _large_vocab(database_url: str, cfg: SynthConfig) -> dict[str, float]:
    """Stored bytes ÷ payload and 128K-token reconstruction p99 for one execution of ``cfg``, fresh database."""
    w = synthetic_execution(cfg)
    calls = [e for e in w.events if isinstance(e, ModelCall)]
    n_logprobs = sum(int(c.output_logprobs.size) for c in calls)
    url, dsn = fresh_database(database_url)
    try:
        store = Store.open(url)
        base = _relation_bytes(store)
        store.apply(w.events)
        stored = _relation_bytes(store) - base
        payload = 4 * store.stats()["tree_tokens"] + 4 * n_logprobs
        big = _near_128k(store, calls)
        times, _ = _reconstruct_ms(store, big, rounds=20)
        store.close()
    finally:
        drop_database(dsn, url)
    return {"stored_over_payload": round(stored / payload, 3),
            "reconstruct_p99_ms": round(times[int(len(times) * 0.99) - 1], 2)}


def run(database_url: str, *, repeats: int, seed: int) -> dict[str, Any]:
    cfg = SynthConfig(seed=seed)
    w = synthetic_execution(cfg)
    events = w.events
    calls = [e for e in events if isinstance(e, ModelCall)]
    spans = span_bytes(events)
    tokens = sum(e.n_tokens() for e in events)
    n_logprobs = sum(int(c.output_logprobs.size) for c in calls)
    console.print(f"synthetic execution: {tokens:,} tokens, {len(calls)} calls, {len(events)} events")

    later = synthetic_execution(SynthConfig(seed=seed + 1))
    later_tokens = sum(e.n_tokens() for e in later.events)
    frames = _event_span_frames(events)
    apply_s, copy_s, stored, warm_s, floor_s, free_s = [], [], [], [], [], []
    phases: list[dict[str, float]] = []
    recon_ms: list[float] = []
    for r in range(repeats):
        url, dsn = fresh_database(database_url)
        try:
            store = Store.open(url)
            base = _relation_bytes(store)
            copy_s.append(raw_copy(store, spans))
            with store.transaction() as conn:
                conn.execute(sa.text("DROP TABLE raw_copy"))
            t0 = time.perf_counter()
            applied = store.apply(events)
            apply_s.append(time.perf_counter() - t0)
            phases.append(applied.timings)
            stored.append(_relation_bytes(store) - base)
            stats = store.stats()
            rows = _export_rows(store)
            t0 = time.perf_counter()
            store.apply(later.events)  # steady state: a store (and process) that has applied before
            warm_s.append(time.perf_counter() - t0)
            if r == 0:
                big = _near_128k(store, calls)
                store.cache = type(store.cache)(store.cache.max_nodes)
                for c in big:  # warm-up, then measure
                    store.reconstruct_input(c.call_id)
                recon_ms, ids = _reconstruct_ms(store, big, rounds=40)
                recon_len = int(ids.size)
                expected = np.concatenate([w.context(big[-1].parent), big[-1].appended])  # type: ignore[arg-type]
                assert np.array_equal(ids, expected), "reconstruction differs from the recorded input"
            store.close()
        finally:
            drop_database(dsn, url)
        floor_url, floor_dsn = fresh_database(database_url)
        try:
            floor_s.append(_store_floor(floor_url, rows))
        finally:
            drop_database(floor_dsn, floor_url)
        free_url, free_dsn = fresh_database(database_url)
        try:
            free_s.append(_free_planner(free_url, events, frames, rows))
        finally:
            drop_database(free_dsn, free_url)
    hash_s = _hash_seconds(events)
    big_vocab = _large_vocab(database_url, SynthConfig(seed=seed, vocab_size=LARGE_VOCAB))
    payload = 4 * stats["tree_tokens"] + 4 * n_logprobs
    naive = 4 * stats["naive_tokens"] + 4 * n_logprobs
    apply_tps = tokens / statistics.median(apply_s)
    copy_tps = tokens / statistics.median(copy_s)
    return {
        "tokens": tokens,
        "calls": len(calls),
        "tree_tokens": stats["tree_tokens"],
        "apply_tokens_per_s": round(apply_tps),
        "raw_copy_tokens_per_s": round(copy_tps),
        "apply_vs_copy_ratio": round(apply_tps / copy_tps, 3),
        "apply_warm_tokens_per_s": round(later_tokens / statistics.median(warm_s)),
        "apply_warm_vs_copy_ratio": round(later_tokens / statistics.median(warm_s) / copy_tps, 3),
        "store_floor_ms": round(statistics.median(floor_s) * 1000, 1),
        "store_floor_vs_copy_ratio": round(statistics.median(copy_s) / statistics.median(floor_s), 3),
        "hash_ms": round(hash_s * 1000, 1),
        # Nothing but apply's look-ups and the server's own share: every hash and check hidden.
        "floor_and_lookups_vs_copy_ratio": round(statistics.median(copy_s) / (
            statistics.median(floor_s) + statistics.median(p["lookups"] for p in phases)), 3),
        "free_planner_ms": round(statistics.median(free_s) * 1000, 1),
        "free_planner_vs_copy_ratio": round(statistics.median(copy_s) / statistics.median(free_s), 3),
        "stored_bytes": int(statistics.median(stored)),
        "payload_bytes": payload,
        "stored_over_payload": round(statistics.median(stored) / payload, 3),
        f"stored_over_payload_vocab_{LARGE_VOCAB}": big_vocab["stored_over_payload"],
        f"reconstruct_p99_ms_vocab_{LARGE_VOCAB}": big_vocab["reconstruct_p99_ms"],
        "naive_bytes": naive,
        "storage_ratio_vs_naive": round(naive / statistics.median(stored), 1),
        "reconstruct_tokens": recon_len,
        "reconstruct_p50_ms": round(recon_ms[len(recon_ms) // 2], 2),
        "reconstruct_p99_ms": round(recon_ms[int(len(recon_ms) * 0.99) - 1], 2),
        "apply_phases_ms": {k: round(statistics.median(p[k] for p in phases) * 1000, 1) for k in phases[0]},
        "raw_copy_ms": round(statistics.median(copy_s) * 1000, 1),
        "repeats": repeats,
    }


def store_input_len(store: Store, call_id: str) -> int:
    with store.transaction() as conn:
        return int(conn.execute(sa.select(t.calls.c.input_len).where(t.calls.c.call_id == call_id)).scalar_one())


def plot(figures: dict[str, Any], path: Path) -> Path:
    """Where apply's time goes, phase by phase, next to the raw COPY of the same bytes (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    phases = figures["apply_phases_ms"]
    fig, ax = plt.subplots(figsize=(8.5, 3.6))
    colors = plt.get_cmap("tab10")
    left = 0.0
    for i, (name, ms) in enumerate(phases.items()):
        ax.barh("apply", ms, left=left, color=colors(i), label=f"{name} {ms:.0f} ms")
        left += ms
    free, floor = figures["free_planner_ms"], figures["store_floor_ms"]
    ax.barh("free planner", free, color="tan", label=f"free planner {free:.0f} ms")
    ax.barh("rows copied back", floor, color="silver", label=f"the rows apply stored, copied back {floor:.0f} ms")
    ax.barh("raw COPY", figures["raw_copy_ms"], color="grey", label=f"raw COPY {figures['raw_copy_ms']:.0f} ms")
    ax.axvline(2 * figures["raw_copy_ms"], color="red", linestyle="--", linewidth=1,
               label=f"target: 0.5x throughput = {2 * figures['raw_copy_ms']:.0f} ms")
    ax.set_xlabel(f"ms for one {figures['tokens']:,}-token execution (medians of {figures['repeats']})")
    ax.set_title(f"apply = {figures['apply_vs_copy_ratio']}x raw binary COPY throughput (a planner that cost "
                 f"nothing: {figures['free_planner_vs_copy_ratio']}x)", fontsize=10)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.28), ncol=4, frameon=False)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url", default=os.environ.get("SAPWOOD_TEST_DATABASE_URL"),
                        help="PostgreSQL server URL (a fresh database is created on it per repeat)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plot", type=Path, default=Path("out/bench_store.png"),
                        help="where to write the apply-phase chart (PNG)")
    args = parser.parse_args()
    if not args.database_url or not args.database_url.startswith("postgresql"):
        parser.error("needs --database-url postgresql+psycopg://... (or SAPWOOD_TEST_DATABASE_URL)")
    figures = run(args.database_url, repeats=args.repeats, seed=args.seed)
    targets = {"apply_vs_copy_ratio": ">= 0.5", "stored_over_payload": "<= 1.1",
               "storage_ratio_vs_naive": ">= 25", "reconstruct_p99_ms": "<= 30"}
    for key, target in targets.items():
        console.print(f"{key:>24}: {figures[key]}  (target {target})")
    console.print(f"warm apply: {figures['apply_warm_vs_copy_ratio']}x raw COPY; the rows apply stored, copied back: "
                  f"{figures['store_floor_ms']} ms = {figures['store_floor_vs_copy_ratio']}x; apply with planning "
                  f"free (look-ups, hashing ({figures['hash_ms']} ms) overlapped with the spans' COPY, rows made "
                  f"beforehand): {figures['free_planner_ms']} ms = {figures['free_planner_vs_copy_ratio']}x; the floor "
                  f"and the look-ups alone: {figures['floor_and_lookups_vs_copy_ratio']}x")
    console.print(f"apply phases (ms): {figures['apply_phases_ms']}; raw COPY {figures['raw_copy_ms']} ms; "
                  f"chart: {plot(figures, args.plot)}")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
