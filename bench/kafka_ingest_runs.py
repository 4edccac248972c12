"""How ``bench_kafka_ingest.py`` runs and times an ingest: in a thread of the benchmark, or in child
processes that alternate this checkout's code with another checkout's (``--compare-with``).

Times come from the service's own stats (``time.monotonic()`` seconds): start → last commit (wall
clock), first batch → last commit (busy), and the sum of its ingest-transaction histogram.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from sqlalchemy.engine import make_url

from sapwood.ingest import IngestConfig, IngestService, IngestStats
from sapwood.ingest.topics import end_offsets
from sapwood.platform.store import Store


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def seconds_since(start: float, service: IngestService) -> float:
    """Seconds from ``start`` (``time.monotonic()``) to the service's last commit."""
    assert service.stats.last_commit_at is not None
    return service.stats.last_commit_at - start


def transaction_seconds(service: IngestService) -> float:
    """Seconds the service spent inside its ingest transactions (the apply histogram's sum)."""
    metric = next(iter(service.metrics.apply_seconds.collect()))
    return float(next(s.value for s in metric.samples if s.name.endswith("_sum")))


class RunningIngest:
    """An :class:`IngestService` running on a thread of this process while the block runs."""

    def __init__(self, config: IngestConfig) -> None:
        self.service = IngestService(config)
        self.thread = threading.Thread(target=self.service.run, daemon=True)

    def __enter__(self) -> RunningIngest:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.service.stop()
        self.thread.join(60)

    def wait_committed(self, ends: dict[int, int], timeout_s: float) -> None:
        """Until the service has committed offsets reaching ``ends`` (partition → log-end offset).

        Reads what the service keeps after each commit, with no database query: nothing competes
        with the ingest being measured (a query every 20 ms from this process, as an earlier
        version ran, cost the ingest a quarter of its throughput).
        """
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < timeout_s:
            if not self.thread.is_alive():
                raise RuntimeError("the ingest service stopped before catching up")
            committed = self.service.committed_offsets()
            if all((committed.get(p) or 0) >= end for p, end in ends.items()):
                return
            time.sleep(0.02)
        raise TimeoutError(f"lag did not return to zero within {timeout_s} s")


def timed_ingest(config: IngestConfig, ends: dict[int, int]) -> tuple[float, IngestStats, float]:
    """Run an ingest of ``config`` in this process until its commits reach ``ends`` (partition → log-end
    offset): seconds from service start to its last commit, its stats, seconds inside its transactions."""
    t0 = time.monotonic()
    with RunningIngest(config) as running:
        running.wait_committed(ends, 3600)
        service = running.service
        seconds = seconds_since(t0, service)
        stats = service.stats
        apply_sum = transaction_seconds(service)
    return seconds, stats, apply_sum


COMPONENTS = ("platform", "ingest", "rollout", "learner", "scheduler", "api", "demo")


def source_path(tree: Path) -> str:
    """``PYTHONPATH`` that imports ``sapwood`` from the checkout ``tree``."""
    return os.pathsep.join(str(tree / c / "src") for c in COMPONENTS if (tree / c / "src").is_dir())


def ingest_once(args: argparse.Namespace) -> dict[str, Any]:
    """One ingest of ``--topic`` into ``--database-url`` by a fresh group (``--ingest-once``: a child run)."""
    config = IngestConfig(database_url=args.database_url, bootstrap=args.bootstrap, topic=args.topic,
                          group=f"bench-once-{uuid.uuid4().hex[:8]}", batch_size=args.batch_size, partitions=0,
                          dead_letter_topic=None, migrate=False)
    seconds, stats, apply_sum = timed_ingest(config, end_offsets(args.bootstrap, args.topic))
    assert stats.first_batch_at is not None and stats.last_commit_at is not None and stats.dead_letters == 0
    return {"seconds": seconds, "busy_seconds": stats.last_commit_at - stats.first_batch_at,
            "transaction_seconds": apply_sum, "events": stats.events, "tokens": stats.tokens,
            "service_module": sys.modules[IngestService.__module__].__file__}


def compare_trees(args: argparse.Namespace, admin: dict[str, Any], topic: str, tokens: int,
                  script: Path) -> dict[str, Any]:
    """Ingest ``topic`` with this checkout's code and ``--compare-with``'s, alternating, each into a fresh
    database; medians of tokens/s and of the per-round ratio this/other.

    Each run is ``script --ingest-once`` (the benchmark itself) in a child process whose ``PYTHONPATH``
    holds only one tree's ``<component>/src`` folders."""
    trees = {"this": Path(__file__).resolve().parents[1], "other": args.compare_with.resolve()}
    runs: dict[str, list[dict[str, Any]]] = {"this": [], "other": []}
    for round_ in range(args.rounds):
        for label in (("other", "this") if round_ % 2 == 0 else ("this", "other")):
            database = f"sapwood_bench_{uuid.uuid4().hex[:10]}"
            with psycopg.connect(**admin) as conn:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
            db_url = make_url(args.database_url).set(database=database).render_as_string(hide_password=False)
            try:
                Store.open(db_url).close()  # migrated here, outside the measured run
                env = {**os.environ, "PYTHONPATH": source_path(trees[label])}
                out = subprocess.run([sys.executable, str(script), "--ingest-once", "--database-url", db_url,
                                      "--bootstrap", args.bootstrap, "--topic", topic,
                                      "--batch-size", str(args.batch_size)],
                                     env=env, capture_output=True, text=True, timeout=3600, check=False)
                if out.returncode != 0:
                    raise RuntimeError(f"{label} ingest failed: {out.stderr[-2000:]}")
                run = json.loads(out.stdout.strip().splitlines()[-1])
            finally:
                with psycopg.connect(**admin) as conn:
                    conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database)))
            assert run["tokens"] == tokens, run
            if not Path(run.pop("service_module")).resolve().is_relative_to(trees[label]):
                raise RuntimeError(f"the {label} run imported sapwood from outside {trees[label]}")
            run["tokens_per_s"] = tokens / run["seconds"]
            run["busy_tokens_per_s"] = tokens / run["busy_seconds"]
            runs[label].append(run)
            log(f"round {round_ + 1}/{args.rounds} {label}: {run['tokens_per_s']:,.0f} tokens/s wall clock, "
                f"{run['busy_tokens_per_s']:,.0f} busy")

    def median(values: list[float]) -> float:
        return sorted(values)[len(values) // 2]

    figures: dict[str, Any] = {"rounds": args.rounds}
    for key in ("tokens_per_s", "busy_tokens_per_s"):
        figures[key] = {label: [round(r[key]) for r in rs] for label, rs in runs.items()}
        figures[f"{key}_ratio_this_vs_other"] = round(median(
            [t[key] / o[key] for t, o in zip(runs["this"], runs["other"], strict=True)]), 3)
    return figures
