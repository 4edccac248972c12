"""Fault campaign against real PostgreSQL and Kafka: anyone can rerun it, CI runs a short round.

    python bench/chaos.py --database-url postgresql+psycopg://postgres@127.0.0.1:5432/postgres \\
        --bootstrap 127.0.0.1:9092 [--rounds 12] [--faults kill,zombie,terminate,poison,broker] \\
        [--broker-restart local | --broker-restart "<shell command>"]

(defaults: ``SAPWOOD_TEST_DATABASE_URL`` / ``SAPWOOD_TEST_KAFKA_BOOTSTRAP``). A fresh database and
fresh topics are created. While a producer writes synthetic executions (``KafkaTransport``, every
delivery acknowledgement kept in a ledger), ``--processes`` ``sapwood ingest`` child processes of one
group consume them, and each round injects one fault, cycling through ``--faults``:

* ``kill``: SIGKILL of one ingest process under load, restarted at once;
* ``zombie``: SIGSTOP of one process for ``--zombie-s`` seconds, then SIGCONT;
* ``terminate``: ``pg_terminate_backend`` of an ingest connection, inside a transaction when one is
  caught within 3 s (counted as mid-transaction);
* ``poison``: one record of every kind of :func:`sapwood.ingest.poison.catalogue`, with the dead-letter
  reason each must get;
* ``broker``: the broker restarted during production (``--broker-restart local`` restarts the test broker
  of this checkout's ``scripts/services.py``; any other value is a shell command).

Recovery of a round: seconds from the start of the fault (the SIGKILL, the SIGSTOP, the termination, the
first poison sent, the broker restart begun) until every record already written when it struck is applied
(stored offsets ≥ the log-end offsets sampled just after it; for poison, after the last poison record;
for the broker, just before the restart). A killed process's partitions wait for its restart; a zombie's
for the group to route around it or for its SIGCONT, whichever comes first.

At the end: producer stopped, ingest catches up and gets SIGTERM; then the store is compared with the ledger
(lost = acknowledged but not stored, duplicated = stored twice or dead-lettered twice), dead letters
expected/got by reason, every model call's input rebuilt and compared, projections hashed before and after a
rebuild, and shutdowns checked for exit 0 without ERROR lines.

The last stdout line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from rich.console import Console
from rich.table import Table

from sapwood.ingest.poison import catalogue
from sapwood.platform import schema as t
from sapwood.platform.events import Event, ModelCall
from sapwood.platform.store import Store
from sapwood.platform.synthetic import SynthConfig, synthetic_execution
from sapwood.platform.writer import ExecutionWriter
from sapwood.rollout import KafkaTransport

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling chaos_servers, however this file is loaded
from chaos_servers import (
    APP_NAME,
    create_topics,
    fresh_database,
    local_broker_restart,
    log_end_offsets,
    terminate_backend,
    wait_applied,
)

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka import KafkaProducer

FAULTS = ("kill", "zombie", "terminate", "poison", "broker")
SMALL = SynthConfig(calls=10, forks=1, fork_depth=2, segments=2, obs_min=5, obs_max=60, out_min=3, out_max=30,
                    system_tokens=30, task_tokens=10, summary_tokens=8, vocab_size=500)
console = Console(stderr=True)


@dataclass
class CampaignConfig:
    database_url: str
    bootstrap: str
    rounds: int = 8
    faults: tuple[str, ...] = ("kill", "zombie", "terminate", "poison")
    processes: int = 2
    partitions: int = 4
    zombie_s: float = 3.0
    executions_per_s: float = 5.0
    settle_s: float = 1.0
    recovery_timeout_s: float = 90.0
    broker_restart: Callable[[], Any] | None = None
    seed: int = 0
    log_dir: Path | None = None


@dataclass
class Round:
    fault: str
    recovery_s: float | None
    detail: str = ""


@dataclass
class Report:
    rounds: list[Round] = field(default_factory=list)
    acked: int = 0
    delivery_failures: int = 0
    lost: int = 0
    duplicated: int = 0
    unexpected: int = 0
    dead_letters_expected: Counter[str] = field(default_factory=Counter)
    dead_letters_got: Counter[str] = field(default_factory=Counter)
    calls_checked: int = 0
    calls_exact: int = 0
    projection_equal: bool = False
    shutdowns: int = 0
    clean_shutdowns: int = 0
    error_lines: int = 0
    mid_transaction: int = 0

    @property
    def ok(self) -> bool:
        return (self.lost == 0 and self.duplicated == 0 and self.unexpected == 0 and self.projection_equal
                and self.dead_letters_expected == self.dead_letters_got and self.calls_exact == self.calls_checked
                and all(r.recovery_s is not None for r in self.rounds))

    def figures(self) -> dict[str, Any]:
        by_fault: dict[str, dict[str, Any]] = {}
        for fault in dict.fromkeys(r.fault for r in self.rounds):
            rec = [r.recovery_s for r in self.rounds if r.fault == fault]
            done = [x for x in rec if x is not None]
            by_fault[fault] = {"attempts": len(rec), "recovered": len(done),
                               "recovery_p50_s": round(statistics.median(done), 2) if done else None,
                               "recovery_max_s": round(max(done), 2) if done else None}
        return {"faults": by_fault, "acked_events": self.acked, "delivery_failures": self.delivery_failures,
                "lost": self.lost, "duplicated": self.duplicated, "stored_unacknowledged": self.unexpected,
                "dead_letters_expected": dict(self.dead_letters_expected),
                "dead_letters_got": dict(self.dead_letters_got), "calls_checked": self.calls_checked,
                "calls_exact": self.calls_exact, "projection_hash_equal_after_rebuild": self.projection_equal,
                "mid_transaction_terminations": self.mid_transaction, "shutdowns": self.shutdowns,
                "clean_shutdowns": self.clean_shutdowns, "ok": self.ok}


class Producer(threading.Thread):
    """Synthetic executions through ``KafkaTransport`` until stopped; keeps the writers and the ledger."""

    def __init__(self, bootstrap: str, topic: str, rate: float, seed: int) -> None:
        super().__init__(daemon=True, name="chaos-producer")
        self.bootstrap, self.topic, self.rate, self.seed = bootstrap, topic, rate, seed
        self.writers: dict[str, ExecutionWriter] = {}
        self.acked: list[Event] = []
        self.failed: list[Event] = []
        self.send_errors = 0
        self.stop = threading.Event()
        self._lock = threading.Lock()

    def delivered(self, event: Event, error: BaseException | None) -> None:
        with self._lock:
            (self.failed if error is not None else self.acked).append(event)

    def run(self) -> None:
        seed = self.seed
        with KafkaTransport(self.bootstrap, topic=self.topic, on_delivery=self.delivered, linger_ms=2,
                            max_block_s=60) as transport:
            while not self.stop.is_set():
                writer = synthetic_execution(SynthConfig(**{**SMALL.__dict__, "seed": seed}))
                self.writers[writer.execution_id] = writer
                for ev in writer.events:
                    try:
                        transport.send(ev)
                    except Exception:  # a broker outage longer than max_block_s: counted, the event is not acked
                        self.send_errors += 1
                        self.delivered(ev, RuntimeError("not sent"))
                seed += 1
                self.stop.wait(1.0 / self.rate)


class Fleet:
    """``--processes`` ``sapwood ingest`` children, one log per slot (a restart appends to its slot's log)."""

    def __init__(self, url: str, bootstrap: str, topic: str, group: str, n: int, log_dir: Path) -> None:
        self.args = [sys.executable, "-m", "sapwood.ingest", "--database-url", url, "--bootstrap", bootstrap,
                     "--topic", topic, "--group", group, "--batch-size", "50", "--partitions", "0",
                     "--dead-letter-topic", f"{topic}.dlq", "--application-name", APP_NAME,
                     "--max-event-bytes", "1000000"]
        self.logs = [log_dir / f"ingest-{i}.log" for i in range(n)]
        self.procs: list[subprocess.Popen[bytes] | None] = [None] * n

    def spawn(self, i: int) -> None:
        with open(self.logs[i], "ab") as out:
            self.procs[i] = subprocess.Popen(self.args, stdout=out, stderr=subprocess.STDOUT)

    def wait_assigned(self, timeout_s: float) -> None:
        """Until every slot's log shows a partition assignment."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if all(log.exists() and "assigned [" in log.read_text(errors="replace") for log in self.logs):
                return
            time.sleep(0.1)
        raise RuntimeError(f"ingest processes got no partitions within {timeout_s} s; logs in {self.logs[0].parent}")

    def signal(self, i: int, sig: int) -> None:
        proc = self.procs[i]
        assert proc is not None
        proc.send_signal(sig)

    def kill(self, i: int) -> None:
        proc = self.procs[i]
        assert proc is not None
        proc.kill()
        proc.wait(30)

    def shutdown(self) -> tuple[int, int, int]:
        """SIGTERM every process; (shutdowns, clean ones: exit 0 and no ERROR line after the signal, ERROR lines)."""
        marks = [log.stat().st_size if log.exists() else 0 for log in self.logs]
        for proc in self.procs:
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        clean = errors = 0
        for i, proc in enumerate(self.procs):
            if proc is None:
                continue
            try:
                code = proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = -9
            with open(self.logs[i], "rb") as f:
                f.seek(marks[i])
                tail = f.read().decode(errors="replace")
            bad = sum(1 for line in tail.splitlines() if " ERROR " in line or line.startswith("Traceback"))
            errors += bad
            clean += int(code == 0 and bad == 0)
        return len(self.procs), clean, errors

    def kill_all(self) -> None:
        for proc in self.procs:
            if proc is not None and proc.poll() is None:
                proc.kill()



def run_campaign(cfg: CampaignConfig, *, progress: Callable[[str], None] = console.log) -> Report:
    """Run ``cfg.rounds`` fault rounds against a database and a broker; see the module docstring."""
    unknown = set(cfg.faults) - set(FAULTS)
    if unknown or not cfg.faults:
        raise ValueError(f"faults must be some of {FAULTS}, got {cfg.faults}")
    if "broker" in cfg.faults and cfg.broker_restart is None:
        raise ValueError("the broker fault needs a way to restart the broker (--broker-restart)")
    rng = random.Random(cfg.seed)
    topic, group = f"chaos-{uuid.uuid4().hex[:10]}", f"chaos-{uuid.uuid4().hex[:10]}"
    create_topics(cfg.bootstrap, topic, cfg.partitions)
    store = Store.open(cfg.database_url)
    log_dir = cfg.log_dir or Path(tempfile.mkdtemp(prefix="sapwood-chaos-"))
    fleet = Fleet(cfg.database_url, cfg.bootstrap, topic, group, cfg.processes, log_dir)
    producer = Producer(cfg.bootstrap, topic, cfg.executions_per_s, cfg.seed * 100_000)
    raw = KafkaProducer(bootstrap_servers=cfg.bootstrap, client_id="sapwood-chaos-poison", acks="all",
                        max_request_size=2 * 1024 * 1024, reconnect_backoff_max_ms=1000)
    report = Report()
    poison_valid: set[str] = set()
    try:
        for i in range(cfg.processes):
            fleet.spawn(i)
        producer.start()
        fleet.wait_assigned(120)  # every process joined: recoveries measure faults, not start-up
        time.sleep(1.0)
        wait_applied(store.engine, group, topic, log_end_offsets(cfg.bootstrap, topic), cfg.recovery_timeout_s)
        for n in range(cfg.rounds):
            fault = cfg.faults[n % len(cfg.faults)]
            slot = rng.randrange(cfg.processes)
            ends = log_end_offsets(cfg.bootstrap, topic)
            detail = ""
            started = time.monotonic()
            # the log ends are sampled once the fault has struck: records the victim had to apply are pending
            if fault == "kill":
                time.sleep(rng.uniform(0.2, 1.0))  # mid-batch, most likely
                started = time.monotonic()
                fleet.kill(slot)
                ends = log_end_offsets(cfg.bootstrap, topic)
                fleet.spawn(slot)
            elif fault == "zombie":
                fleet.signal(slot, signal.SIGSTOP)
                ends = log_end_offsets(cfg.bootstrap, topic)
                time.sleep(cfg.zombie_s)
                fleet.signal(slot, signal.SIGCONT)
            elif fault == "terminate":
                killed, in_tx = terminate_backend(cfg.database_url)
                ends = log_end_offsets(cfg.bootstrap, topic)
                report.mid_transaction += int(in_tx)
                detail = "mid-transaction" if in_tx else ("idle" if killed else "no backend")
            elif fault == "poison":
                for p in catalogue(cfg.seed * 1000 + n * 20):
                    for value in p.records:
                        raw.send(topic, value=value, key=p.key)
                    if p.reason:
                        report.dead_letters_expected[p.reason] += 1
                    poison_valid.update(p.valid)
                raw.flush(60)
                ends = log_end_offsets(cfg.bootstrap, topic)
            elif fault == "broker":
                assert cfg.broker_restart is not None
                cfg.broker_restart()
            waited = time.monotonic()
            applied = wait_applied(store.engine, group, topic, ends, cfg.recovery_timeout_s)
            recovery = None if applied is None else applied + waited - started
            report.rounds.append(Round(fault, recovery, detail))
            progress(f"round {n + 1}/{cfg.rounds}: {fault} {detail} recovered in "
                     f"{'—' if recovery is None else f'{recovery:.2f} s'}")
            time.sleep(cfg.settle_s)
        producer.stop.set()
        producer.join(120)
        raw.flush(60)
        if wait_applied(store.engine, group, topic, log_end_offsets(cfg.bootstrap, topic), 180) is None:
            progress("ingest did not catch up within 180 s")
        report.shutdowns, report.clean_shutdowns, report.error_lines = fleet.shutdown()
    finally:
        producer.stop.set()
        fleet.kill_all()
        raw.close()
    _verify(store, producer, poison_valid, report)
    store.close()
    return report


def _verify(store: Store, producer: Producer, poison_valid: set[str], report: Report) -> None:
    with store.engine.connect() as conn:
        ids = [str(r[0]) for r in conn.execute(sa.select(t.events.c.event_id))]
        letters = conn.execute(sa.select(t.dead_letters.c.reason, t.dead_letters.c.source)).all()
    stored = set(ids)
    acked = {e.event_id for e in producer.acked}
    failed = {e.event_id for e in producer.failed}
    report.acked, report.delivery_failures = len(acked), len(failed - acked)
    report.lost = len(acked - stored)
    report.unexpected = len(stored - acked - failed - poison_valid)
    report.duplicated = (len(ids) - len(stored)) + sum(c - 1 for c in Counter(s for _, s in letters).values() if c > 1)
    report.dead_letters_got = Counter(r for r, _ in letters)
    for writer in producer.writers.values():
        for ev in writer.events:
            if isinstance(ev, ModelCall) and ev.event_id in acked:
                full = writer.context(ev.parent) if ev.parent else ev.appended[:0]
                expected = list(full) + list(ev.appended)
                report.calls_checked += 1
                report.calls_exact += int(store.reconstruct_input(ev.call_id).tolist() == expected)
    before = store.projection_hash()
    store.rebuild_projections()
    report.projection_equal = store.projection_hash() == before


def render(report: Report) -> Table:
    table = Table(title="Sapwood ingest fault campaign")
    for col in ("fault", "attempts", "recovered", "recovery p50 s", "recovery max s", "notes"):
        table.add_column(col, justify="left" if col in ("fault", "notes") else "right")
    for fault, f in report.figures()["faults"].items():
        notes = f"{report.mid_transaction} mid-transaction" if fault == "terminate" else ""
        table.add_row(fault, str(f["attempts"]), str(f["recovered"]), str(f["recovery_p50_s"]),
                      str(f["recovery_max_s"]), notes)
    exp, got = report.dead_letters_expected, report.dead_letters_got
    table.add_section()
    table.add_row("events acknowledged", str(report.acked), "", "", "",
                  f"{report.delivery_failures} delivery failures (allowed either way)")
    table.add_row("lost", str(report.lost), "", "", "", "acknowledged but not stored")
    table.add_row("duplicated", str(report.duplicated), "", "", "", "stored or dead-lettered twice")
    table.add_row("stored, never sent", str(report.unexpected), "", "", "", "")
    table.add_row("dead letters expected/got", f"{sum(exp.values())}/{sum(got.values())}", "", "", "",
                  "same reasons" if exp == got else f"expected {dict(exp)} got {dict(got)}")
    table.add_row("inputs rebuilt exactly", f"{report.calls_exact}/{report.calls_checked}", "", "", "", "")
    table.add_row("projection hash after rebuild", "equal" if report.projection_equal else "DIFFERENT", "", "", "",
                  "")
    table.add_row("clean shutdowns", f"{report.clean_shutdowns}/{report.shutdowns}", "", "", "",
                  f"{report.error_lines} ERROR lines after SIGTERM")
    return table



def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--database-url", default=os.environ.get("SAPWOOD_TEST_DATABASE_URL"),
                    help="PostgreSQL server URL (a fresh database is created on it)")
    ap.add_argument("--bootstrap", default=os.environ.get("SAPWOOD_TEST_KAFKA_BOOTSTRAP"))
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--faults", default="kill,zombie,terminate,poison")
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--zombie-s", type=float, default=12.0, help="SIGSTOP length (above the 10 s session timeout: "
                    "the group moves the zombie's partitions away and it wakes up behind)")
    ap.add_argument("--rate", type=float, default=5.0, help="executions per second produced")
    ap.add_argument("--broker-restart", default=None, help="'local' or a shell command restarting the broker")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep-database", action="store_true")
    args = ap.parse_args(argv)
    if not args.database_url or not args.bootstrap:
        ap.error("--database-url and --bootstrap are required (or SAPWOOD_TEST_DATABASE_URL/_KAFKA_BOOTSTRAP)")
    restart: Callable[[], Any] | None = None
    if args.broker_restart == "local":
        restart = local_broker_restart()
    elif args.broker_restart:
        command = args.broker_restart
        restart = lambda: subprocess.run(command, shell=True, check=True)  # noqa: E731
    url, drop = fresh_database(args.database_url)
    cfg = CampaignConfig(database_url=url, bootstrap=args.bootstrap, rounds=args.rounds,
                         faults=tuple(f for f in args.faults.split(",") if f), processes=args.processes,
                         zombie_s=args.zombie_s, executions_per_s=args.rate, broker_restart=restart, seed=args.seed)
    t0 = time.monotonic()
    try:
        report = run_campaign(cfg)
    finally:
        if not args.keep_database:
            drop()
    Console().print(render(report))
    print(json.dumps({**report.figures(), "rounds": args.rounds, "wall_s": round(time.monotonic() - t0, 1)}))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
