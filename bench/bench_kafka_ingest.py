"""Kafka → PostgreSQL ingest benchmark, with its baselines measured in the same run.

    python bench/bench_kafka_ingest.py --database-url postgresql+psycopg://postgres@127.0.0.1:5432/postgres \\
        --bootstrap 127.0.0.1:9092 [--executions 4] [--pause-s 30]

(defaults: ``SAPWOOD_TEST_DATABASE_URL`` / ``SAPWOOD_TEST_KAFKA_BOOTSTRAP``). A fresh database
and fresh topics are created and dropped. Figures:

* producer throughput (``KafkaTransport``, idempotent, acks=all) without compression and
  with the Kafka codec the transport picks (zstd when available);
* ingest end to end: synthetic ~700K-token executions (``platform.synthetic``) from Kafka
  into PostgreSQL by :class:`~sapwood.ingest.IngestService` — tokens/s over the wall clock
  from service start to its last commit (connection, group join included), over the busy
  time (first batch to last commit) and over the time inside ingest transactions, and
  their ratio to a raw binary ``COPY`` of the same token and log-prob bytes into a bare table
  (median of three runs; the baseline of ``bench_store.py``, so the two ratios compare);
* lag recovery: ingest stopped while producers write for ``--pause-s`` seconds at
  ``--pause-rate`` tokens/s, then restarted: seconds from the restart to the commit that
  brings the lag back to zero;
* scale-out (``--scale-out 1,2``): for each count, that many ``sapwood ingest`` processes join
  one fresh group on an empty topic, then the same executions are produced at full speed;
  tokens/s from the first record sent to the last commit, each count into a fresh database.
  It shows how throughput grows with processes on the machine it runs on (the producer,
  the broker and PostgreSQL share its cores).

``--compare-with TREE`` measures only the ingest end to end, alternating the code of this checkout with
the code of another checkout ``TREE`` of the repository (e.g. ``git worktree add <dir> main``) for
``--rounds`` rounds: each run is a child process of this script with ``PYTHONPATH`` on one tree's
``<component>/src`` folders, ingesting the same topic into a fresh database; the figure is the median
ratio of this checkout's tokens/s to the other's.

The last stdout line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
import warnings
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from sqlalchemy.engine import make_url

from sapwood.ingest import IngestConfig, ingest_lag
from sapwood.ingest.source import consumer_settings
from sapwood.ingest.topics import end_offsets
from sapwood.platform.codec import decode
from sapwood.platform.events import Event
from sapwood.platform.storage.backends import offset_store
from sapwood.platform.store import Store
from sapwood.platform.synthetic import SynthConfig, synthetic_execution
from sapwood.platform.tokens import digest_bytes, pack
from sapwood.rollout import KafkaTransport

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling kafka_ingest_runs, however this file is loaded
from kafka_ingest_runs import RunningIngest, compare_trees, ingest_once, log, seconds_since, timed_ingest

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka import KafkaAdminClient, KafkaConsumer


def executions(n: int, first_seed: int) -> list[list[Event]]:
    """``n`` synthetic executions (≈ 700K tokens each, SynthConfig defaults)."""
    return [synthetic_execution(SynthConfig(seed=first_seed + i), run_id="bench").events for i in range(n)]


def tokens_of(events: list[Event]) -> int:
    return sum(e.n_tokens() for e in events)


def produce(bootstrap: str, topic: str, events: list[Event], compression: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    with KafkaTransport(bootstrap, topic=topic, compression=compression, linger_ms=10,  # type: ignore[arg-type]
                        batch_bytes=1024 * 1024) as transport:
        for ev in events:
            transport.send(ev)
        transport.flush(300)
        used = transport.compression
    seconds = time.perf_counter() - t0
    tokens = tokens_of(events)
    return {"compression": used, "seconds": round(seconds, 3), "events_per_s": round(len(events) / seconds),
            "tokens_per_s": round(tokens / seconds)}


def raw_copy_tokens_per_s(admin: dict[str, Any], database: str, events: list[Event]) -> float:
    """Binary COPY of the events' packed arrays (int32 ids, float32 log-probs) as (digest, bytes) rows.

    The same baseline as ``bench_store.py``: every distinct array once, into a bare table
    with uncompressed out-of-line storage, in one transaction.
    """
    rows: dict[bytes, bytes] = {}
    for e in events:
        for arr in e.array_fields().values():
            if arr.size:
                data = pack(arr)
                rows.setdefault(digest_bytes(data), data)
    with psycopg.connect(**{**admin, "dbname": database}) as conn:
        conn.execute("CREATE TABLE bench_copy (digest bytea PRIMARY KEY, data bytea NOT NULL)")
        conn.execute("ALTER TABLE bench_copy ALTER COLUMN data SET STORAGE EXTERNAL")
        conn.commit()
        t0 = time.perf_counter()
        with conn.cursor() as cur, cur.copy("COPY bench_copy (digest, data) FROM STDIN (FORMAT BINARY)") as copy:
            copy.set_types(["bytea", "bytea"])
            for row in rows.items():
                copy.write_row(row)
        conn.commit()
        seconds = time.perf_counter() - t0
        conn.execute("DROP TABLE bench_copy")
        conn.commit()
    return tokens_of(events) / seconds


def wait_caught_up(ends: dict[int, int], topic: str, group: str, store: Store, timeout_s: float) -> None:
    """Until the stored offsets reach ``ends`` (the log-end offsets, read once: production is over).

    For ingest in other processes. One small query every 100 ms: the figures come from the
    stored commit times, so polling faster would only take CPU from the ingest being measured.
    """
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout_s:
        with store.engine.connect() as conn:
            stored = offset_store(conn).read(conn, group, topic)
        if all(stored.get(p, 0) >= end for p, end in ends.items()):
            return
        time.sleep(0.1)
    raise TimeoutError(f"lag did not return to zero within {timeout_s} s")


def kafka_client_seconds(config: IngestConfig, records: int, *, decode_records: bool) -> float:
    """Seconds the ingest's Kafka client takes to fetch ``records`` records of ``config.topic``
    (fresh group, the service's consumer settings), from the first record to the last; with
    ``decode_records`` each is also decoded as ingest does. Ingest does all of this and more,
    so the ratio to the raw COPY these seconds give bounds the ingest's own."""
    settings = consumer_settings(config, "sapwood-bench-client")
    settings["group_id"] = f"bench-client-{uuid.uuid4().hex[:8]}"
    consumer = KafkaConsumer(**settings)
    deadline = time.monotonic() + 600
    try:
        consumer.subscribe([config.topic])
        while not consumer.partitions_for_topic(config.topic):  # as the service: join knowing the partitions
            if time.monotonic() > deadline:
                raise TimeoutError(f"no partitions known for {config.topic} in 600 s")
            time.sleep(0.05)
        seen, first = 0, 0.0
        while seen < records:
            if time.monotonic() > deadline:
                raise TimeoutError(f"fetched {seen} of {records} records of {config.topic} in 600 s")
            polled = consumer.poll(timeout_ms=1000, max_records=config.batch_size)
            for batch in polled.values():
                if not first:
                    first = time.perf_counter()
                if decode_records:
                    for record in batch:
                        decode(bytes(record.value), validate=False)
                seen += len(batch)
        return time.perf_counter() - first
    finally:
        consumer.close(autocommit=False)


def wait_group_stable(kadmin: Any, group: str, members: int, timeout_s: float = 120) -> None:
    """Until ``group`` has ``members`` members and no rebalance in progress."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout_s:
        info = kadmin.describe_groups([group]).get(group) or {}
        if info.get("group_state") == "Stable" and len(info.get("members") or []) == members:
            return
        time.sleep(0.2)
    raise TimeoutError(f"group {group} did not settle with {members} members within {timeout_s} s")


def scale_out(args: argparse.Namespace, admin: dict[str, Any], kadmin: Any, events: list[Event],
              processes: int, run: str) -> dict[str, Any]:
    """Tokens/s of ``processes`` ingest processes sharing one group, from first record sent to last commit."""
    database = f"sapwood_bench_{uuid.uuid4().hex[:10]}"
    topic, group = f"bench-scale{processes}-{run}", f"bench-scale{processes}-{run}"
    kadmin.create_topics({topic: {"num_partitions": args.partitions}}, wait_for_metadata=True)
    with psycopg.connect(**admin) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
    db_url = make_url(args.database_url).set(database=database).render_as_string(hide_password=False)
    store = Store.open(db_url)  # migrated here, once
    cmd = [sys.executable, "-m", "sapwood.ingest", "--database-url", db_url, "--bootstrap", args.bootstrap,
           "--topic", topic, "--group", group, "--partitions", "0", "--batch-size", str(args.batch_size),
           "--log-level", "WARNING"]
    with tempfile.TemporaryFile() as logs:
        procs = [subprocess.Popen(cmd, stdout=logs, stderr=logs) for _ in range(processes)]
        try:
            wait_group_stable(kadmin, group, processes)
            t0 = time.time()
            produce(args.bootstrap, topic, events, "auto")
            wait_caught_up(end_offsets(args.bootstrap, topic), topic, group, store, 3600)
            with psycopg.connect(**{**admin, "dbname": database}) as conn:
                row = conn.execute("SELECT max(updated_at) FROM consumer_offsets WHERE group_id = %s",
                                   (group,)).fetchone()
            seconds = float(row[0]) - t0 if row and row[0] is not None else time.time() - t0
        finally:
            for proc in procs:
                proc.send_signal(signal.SIGTERM)
            for proc in procs:
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            store.close()
            kadmin.delete_topics([topic])
            with psycopg.connect(**admin) as conn:
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database)))
        failed = [proc.returncode for proc in procs if proc.returncode not in (0, -signal.SIGTERM)]
        if failed:
            logs.seek(0)
            raise RuntimeError(f"ingest processes exited with {failed}: "
                               f"{logs.read()[-2000:].decode(errors='replace')}")
    tokens = tokens_of(events)
    return {"processes": processes, "seconds": round(seconds, 2), "tokens_per_s": round(tokens / seconds)}



def plot(result: dict[str, Any], path: Path) -> Path:
    """Seconds for the main executions: ingest (wall clock, busy, inside transactions), the Kafka
    client alone, the raw COPY, and the time the 0.5× target allows (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    copy_s = result["tokens"] / result["raw_copy_tokens_per_s"]
    ingest, client = result["ingest"], result["kafka_client"]
    bars = [
        ("ingest, wall clock", ingest["seconds"], "tab:red"),
        ("ingest, busy", ingest["busy_seconds"], "tab:orange"),
        ("ingest, in transactions", ingest["transaction_seconds"], "gold"),
        ("Kafka fetch + decode", client["fetch_decode_seconds"], "tab:blue"),
        ("Kafka fetch", client["fetch_seconds"], "lightsteelblue"),
        ("raw COPY", copy_s, "grey"),
    ]
    fig, ax = plt.subplots(figsize=(8.5, 3.4))
    for row, (_label, seconds, color) in enumerate(bars):
        ax.barh(row, seconds, color=color)
        ax.text(seconds, row, f" {seconds:.2f} s = {copy_s / seconds:.2f}x", va="center", fontsize=8)
    ax.set_yticks(range(len(bars)), [b[0] for b in bars])
    ax.axvline(2 * copy_s, color="black", linestyle="--", linewidth=1, label="time a 0.5x ratio allows")
    ax.invert_yaxis()
    ax.set_xlabel(f"seconds for {result['executions']} executions, {result['tokens']:,} tokens")
    ax.set_title(f"Kafka -> PostgreSQL ingest = {result['ingest_vs_raw_copy']}x raw binary COPY throughput")
    ax.legend(fontsize=8, loc="lower right")
    ax.set_xlim(0, max(b[1] for b in bars) * 1.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url", default=os.environ.get("SAPWOOD_TEST_DATABASE_URL"),
                        help="PostgreSQL server (a fresh database is created on it)")
    parser.add_argument("--bootstrap", default=os.environ.get("SAPWOOD_TEST_KAFKA_BOOTSTRAP"))
    parser.add_argument("--executions", type=int, default=4, help="synthetic ~700K-token executions")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=500, help="ingest records per transaction")
    parser.add_argument("--pause-s", type=float, default=30.0, help="seconds of production with ingest stopped")
    parser.add_argument("--pause-rate", type=float, default=200_000.0,
                        help="tokens/s produced while ingest is stopped")
    parser.add_argument("--scale-out", default="",
                        help="comma-separated ingest process counts to compare (e.g. 1,2); empty: skip")
    parser.add_argument("--plot", type=Path, default=Path("out/bench_kafka_ingest.png"),
                        help="where to write the time chart (PNG)")
    parser.add_argument("--compare-with", type=Path, default=None,
                        help="another checkout of the repository: measure only the ingest, alternating its code "
                             "with this checkout's")
    parser.add_argument("--rounds", type=int, default=3, help="alternations of --compare-with")
    parser.add_argument("--ingest-once", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--topic", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not args.database_url or not args.bootstrap:
        parser.error("--database-url and --bootstrap are required (or SAPWOOD_TEST_* variables)")
    logging.basicConfig(level=logging.WARNING)
    if args.ingest_once:
        print(json.dumps(ingest_once(args)))
        return
    if args.compare_with is not None and not (args.compare_with / "ingest" / "src" / "sapwood").is_dir():
        parser.error(f"--compare-with {args.compare_with}: expected a checkout of this repository "
                     "(with ingest/src/sapwood)")
    url = make_url(args.database_url)
    admin: dict[str, Any] = {"host": url.host, "port": url.port or 5432, "user": url.username or "postgres",
             "dbname": url.database or "postgres", "autocommit": True}
    if url.password:
        admin["password"] = url.password
    database = f"sapwood_bench_{uuid.uuid4().hex[:10]}"
    run = uuid.uuid4().hex[:8]
    topics = {name: f"bench-{name}-{run}" for name in ("plain", "compressed", "pause")}
    kadmin = KafkaAdminClient(bootstrap_servers=args.bootstrap, client_id="sapwood-bench")
    kadmin.create_topics({t: {"num_partitions": args.partitions} for t in topics.values()}, wait_for_metadata=True)
    with psycopg.connect(**admin) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
    db_url = url.set(database=database).render_as_string(hide_password=False)
    result: dict[str, Any] = {"bench": "kafka_ingest", "executions": args.executions, "partitions": args.partitions}
    try:
        store = Store.open(db_url)
        t0 = time.perf_counter()
        main_events = [e for ex in executions(args.executions, 0) for e in ex]
        tokens = tokens_of(main_events)
        result.update(events=len(main_events), tokens=tokens, generate_s=round(time.perf_counter() - t0, 2))
        log(f"{len(main_events)} events, {tokens:,} tokens")

        if args.compare_with is not None:
            result["producer_compressed"] = produce(args.bootstrap, topics["compressed"], main_events, "auto")
            result["compare_with"] = compare_trees(args, admin, topics["compressed"], tokens, Path(__file__))
            store.close()
            print(json.dumps(result))
            return
        result["producer_plain"] = produce(args.bootstrap, topics["plain"], main_events, "none")
        result["producer_compressed"] = produce(args.bootstrap, topics["compressed"], main_events, "auto")
        log(f"producer: {result['producer_plain']} / {result['producer_compressed']}")

        group = f"bench-{run}"
        config = IngestConfig(database_url=db_url, bootstrap=args.bootstrap, topic=topics["compressed"], group=group,
                              batch_size=args.batch_size, partitions=0, dead_letter_topic=None, migrate=False)
        ends = end_offsets(args.bootstrap, topics["compressed"])
        seconds, stats, apply_sum = timed_ingest(config, ends)
        assert stats.events == len(main_events) and stats.dead_letters == 0, stats
        assert stats.first_batch_at is not None and stats.last_commit_at is not None
        busy = stats.last_commit_at - stats.first_batch_at
        ingest_tps = tokens / seconds
        copy_runs = sorted(raw_copy_tokens_per_s(admin, database, main_events) for _ in range(3))
        copy_tps = copy_runs[1]  # median of three: the machine is shared, single runs are noisy
        result["ingest"] = {"seconds": round(seconds, 2), "tokens_per_s": round(ingest_tps),
                            "events_per_s": round(len(main_events) / seconds),
                            "busy_seconds": round(busy, 2), "busy_tokens_per_s": round(tokens / busy),
                            "transaction_seconds": round(apply_sum, 2),
                            "tokens_per_transaction_s": round(tokens / apply_sum), "batches": stats.batches}
        result["raw_copy_tokens_per_s"] = round(copy_tps)
        result["raw_copy_runs_tokens_per_s"] = [round(x) for x in copy_runs]
        result["ingest_vs_raw_copy"] = round(ingest_tps / copy_tps, 3)
        result["ingest_busy_vs_raw_copy"] = round(tokens / busy / copy_tps, 3)
        result["ingest_transactions_vs_raw_copy"] = round(tokens / apply_sum / copy_tps, 3)
        log(f"ingest {ingest_tps:,.0f} tokens/s, raw COPY {copy_tps:,.0f} tokens/s")

        # the Kafka client's own share: fetching (and decoding) the same records, nothing stored
        n_records = sum(ends.values())
        fetch = sorted(kafka_client_seconds(config, n_records, decode_records=False) for _ in range(3))[1]
        fetch_decode = sorted(kafka_client_seconds(config, n_records, decode_records=True) for _ in range(3))[1]
        result["kafka_client"] = {
            "fetch_seconds": round(fetch, 3), "fetch_tokens_per_s": round(tokens / fetch),
            "fetch_vs_raw_copy": round(tokens / fetch / copy_tps, 3),
            "fetch_decode_seconds": round(fetch_decode, 3), "fetch_decode_tokens_per_s": round(tokens / fetch_decode),
            "fetch_decode_vs_raw_copy": round(tokens / fetch_decode / copy_tps, 3),
        }
        log(f"Kafka client alone: {result['kafka_client']}")

        # lag recovery: ingest stopped while producers keep writing for --pause-s seconds
        per_execution = tokens / args.executions
        needed = max(1, int(args.pause_rate * args.pause_s / per_execution) + 1)
        pause_events = executions(needed, 1000)
        pgroup = f"bench-pause-{run}"
        pconfig = IngestConfig(database_url=db_url, bootstrap=args.bootstrap, topic=topics["pause"], group=pgroup,
                               batch_size=args.batch_size, partitions=0, dead_letter_topic=None, migrate=False)
        with RunningIngest(pconfig):  # join the group and settle before the pause
            time.sleep(2.0)
        produced_tokens = 0
        produced_events = 0
        t0 = time.perf_counter()
        with KafkaTransport(args.bootstrap, topic=topics["pause"]) as transport:
            stream = (e for ex in pause_events for e in ex)
            for ev in stream:
                transport.send(ev)
                produced_tokens += ev.n_tokens()
                produced_events += 1
                ahead = produced_tokens / args.pause_rate - (time.perf_counter() - t0)
                if ahead > 0:
                    time.sleep(ahead)
                if time.perf_counter() - t0 >= args.pause_s:
                    break
        lag_before = sum(ingest_lag(args.bootstrap, topics["pause"], pgroup, store.engine).values())
        ends = end_offsets(args.bootstrap, topics["pause"])
        t0 = time.monotonic()
        with RunningIngest(pconfig) as running:
            running.wait_committed(ends, 3600)
            recovery = seconds_since(t0, running.service)
        result["lag_recovery"] = {"pause_s": args.pause_s, "pause_rate_tokens_per_s": args.pause_rate,
                                  "backlog_records": lag_before, "backlog_events": produced_events,
                                  "backlog_tokens": produced_tokens, "seconds_to_zero_lag": round(recovery, 2),
                                  "drain_tokens_per_s": round(produced_tokens / recovery)}
        log(f"lag recovery: {result['lag_recovery']}")
        store.close()

        counts = [int(c) for c in args.scale_out.split(",") if c.strip()]
        if counts:
            runs = [scale_out(args, admin, kadmin, main_events, n, run) for n in counts]
            for r in runs:
                r["vs_raw_copy"] = round(r["tokens_per_s"] / copy_tps, 3)
                r["vs_first"] = round(r["tokens_per_s"] / runs[0]["tokens_per_s"], 2)
            result["scale_out"] = {"cpu_cores": os.cpu_count(), "runs": runs}
            log(f"scale-out: {result['scale_out']}")
    finally:
        kadmin.delete_topics(list(topics.values()))
        kadmin.close()
        with psycopg.connect(**admin) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database)))
    log(f"chart: {plot(result, args.plot)}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
