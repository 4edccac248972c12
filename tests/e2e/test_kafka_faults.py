"""Exactly once under process faults: kill -9 of ingest mid-stream, and a rebalance (join + leave).

Both run ``python -m sapwood.ingest`` as child processes while a producer writes, then
compare the store with the producer's ledger: 0 lost, 0 duplicated (events and dead
letters), offsets at the log end, projections equal to a rebuild.
"""

from __future__ import annotations

import random
import re
import threading
import time
from functools import partial
from pathlib import Path

from sapwood.platform.store import Store
from sapwood.platform.synthetic import SynthConfig, synthetic_execution
from sapwood.rollout import KafkaTransport
from tests.support.kafka_ingest import (
    IngestProcess,
    Ledger,
    caught_up,
    check_exactly_once,
    create_topic,
    raw_producer,
    unique,
    wait_until,
)

SMALL = SynthConfig(calls=12, forks=1, fork_depth=2, segments=2, obs_min=5, obs_max=60, out_min=3, out_max=30,
                    system_tokens=30, task_tokens=10, summary_tokens=8, vocab_size=500)


class Producer(threading.Thread):
    """Writes synthetic executions for about ``duration_s`` seconds, with a garbage record now and then."""

    def __init__(self, bootstrap: str, topic: str, duration_s: float, *, garbage_every: int = 0) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.topic, self.duration_s = bootstrap, topic, duration_s
        self.garbage_every = garbage_every
        self.ledger = Ledger()
        self.garbage = 0
        self.error: BaseException | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        try:
            raw = raw_producer(self.bootstrap)
            deadline = time.monotonic() + self.duration_s
            seed = 0
            with KafkaTransport(self.bootstrap, topic=self.topic, on_delivery=self.ledger, linger_ms=2) as transport:
                while time.monotonic() < deadline and not self.stop.is_set():
                    for ev in synthetic_execution(SynthConfig(**{**SMALL.__dict__, "seed": seed})).events:
                        transport.send(ev)
                    seed += 1
                    if self.garbage_every and seed % self.garbage_every == 0:
                        raw.send(self.topic, value=b"garbage %d" % seed).get(30)
                        self.garbage += 1
                    time.sleep(0.1)
            raw.close()
        except BaseException as exc:
            self.error = exc


def test_ingest_killed_repeatedly_loses_and_duplicates_nothing(pg_url: str, kafka_bootstrap: str,
                                                              tmp_path: Path) -> None:
    topic = create_topic(kafka_bootstrap, 4)
    store = Store.open(pg_url)  # migrated before the child processes start
    group = unique("crash")
    log = tmp_path / "ingest.log"

    def spawn() -> IngestProcess:
        # static membership: the restarted process takes the partitions back without waiting for a session timeout
        return IngestProcess(pg_url, kafka_bootstrap, topic, group, log, batch_size=40,
                             instance_id="ingest-crash-0").start()

    def assignments() -> int:
        return len(re.findall(r"assigned \[\d", log.read_text())) if log.exists() else 0

    def ready(before: int, p: IngestProcess) -> bool:
        return assignments() > before or not p.alive()

    producer = Producer(kafka_bootstrap, topic, duration_s=10, garbage_every=5)
    seen = 0
    proc = spawn()
    producer.start()
    rng = random.Random(3)
    kills = 0
    try:
        deadline = time.monotonic() + 90
        while (producer.is_alive() or kills < 3) and time.monotonic() < deadline:
            wait_until(partial(ready, seen, proc), 60, "the ingest process to get partitions")
            time.sleep(rng.uniform(0.5, 2.0))  # ... then it is busy with batches
            proc.kill()  # SIGKILL: no cleanup, maybe mid-transaction
            kills += 1
            seen = assignments()
            proc = spawn()
        producer.join(60)
        assert producer.error is None, producer.error
        wait_until(lambda: caught_up(store.engine, kafka_bootstrap, topic, group), 90, "ingest to catch up")
        wait_until(partial(ready, seen, proc), 60, "the last ingest process to get partitions")
        assert proc.terminate(30) == 0
    finally:
        proc.ensure_dead()
    assert kills >= 3
    assert producer.garbage >= 1
    assert not producer.ledger.failed
    check_exactly_once(store, producer.ledger.acked, bootstrap=kafka_bootstrap, topic=topic, group=group,
                       dead_letters=producer.garbage)


def test_second_ingest_joins_and_leaves_during_the_stream(pg_url: str, kafka_bootstrap: str, tmp_path: Path) -> None:
    topic = create_topic(kafka_bootstrap, 4)
    store = Store.open(pg_url)
    group = unique("rebalance")
    first = IngestProcess(pg_url, kafka_bootstrap, topic, group, tmp_path / "first.log", batch_size=40).start()
    second = IngestProcess(pg_url, kafka_bootstrap, topic, group, tmp_path / "second.log", batch_size=40,
                           application_name="sapwood-ingest-second")
    producer = Producer(kafka_bootstrap, topic, duration_s=90, garbage_every=7)  # until the second one left
    producer.start()
    try:
        time.sleep(2.0)
        second.start()  # joins: the partitions are split between the two
        wait_until(lambda: re.search(r"assigned \[\d", (tmp_path / "second.log").read_text()), 60,
                   "the second process to get partitions")
        time.sleep(3.0)
        assert second.terminate(30) == 0  # SIGTERM: finishes its batch, commits, leaves the group
        time.sleep(1.5)  # the first process takes all partitions back while the stream goes on
        producer.stop.set()
        producer.join(60)
        assert producer.error is None, producer.error
        wait_until(lambda: caught_up(store.engine, kafka_bootstrap, topic, group), 90, "ingest to catch up")
        assert first.terminate(30) == 0
    finally:
        first.ensure_dead()
        second.ensure_dead()
    summary = re.search(r"ingest stopped: (\d+) events", (tmp_path / "second.log").read_text())
    assert summary, "the second process took part of the work"
    assert int(summary.group(1)) > 0, "the second process took part of the work"
    check_exactly_once(store, producer.ledger.acked, bootstrap=kafka_bootstrap, topic=topic, group=group,
                       dead_letters=producer.garbage)
