"""Helpers shared by the ingest and Kafka end-to-end tests."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import sqlalchemy as sa

from sapwood.ingest import IngestConfig, IngestService
from sapwood.ingest.topics import end_offsets
from sapwood.platform import schema as t
from sapwood.platform.codec import encode
from sapwood.platform.events import Event
from sapwood.platform.storage.backends import offset_store
from sapwood.platform.store import Store
from sapwood.rollout import ExecutionRecorder, Recorder


@dataclass(frozen=True)
class FakeTopicPartition:
    """Stands in for kafka-python's ``TopicPartition`` in tests of the ingest's parts without a broker."""

    topic: str
    partition: int


@dataclass
class FakeRecord:
    """Stands in for a consumed Kafka record (the fields the ingest reads)."""

    offset: int
    value: bytes = b""
    key: bytes | None = b"exec-key"

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka import KafkaAdminClient, KafkaProducer


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def create_topic(bootstrap: str, partitions: int = 4, *, configs: dict[str, str] | None = None,
                 prefix: str = "test-events") -> str:
    """A fresh topic with ``partitions`` partitions (ready for producing)."""
    name = unique(prefix)
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="sapwood-test-admin")
    try:
        admin.create_topics({name: {"num_partitions": partitions, "configs": configs or {}}},
                            wait_for_metadata=True)
    finally:
        admin.close()
    return name


def wait_until(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    """Poll ``predicate`` until it returns a truthy value; fail the test after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what} (last value: {value!r})")
        time.sleep(interval)


def ingest_config(url: str, bootstrap: str, topic: str, **kw: Any) -> IngestConfig:
    defaults: dict[str, Any] = {"group": unique("g"), "batch_size": 100, "partitions": 0,
                                "dead_letter_topic": None, "lag_interval_s": 0.5, "migrate": False}
    defaults.update(kw)
    return IngestConfig(database_url=url, bootstrap=bootstrap, topic=topic, **defaults)


@contextlib.contextmanager
def running_ingest(config: IngestConfig) -> Iterator[IngestService]:
    """Run an :class:`IngestService` in a thread; stop it (and check it stopped) on exit."""
    service = IngestService(config)
    errors: list[BaseException] = []

    def target() -> None:
        try:
            service.run()
        except BaseException as exc:  # surfaced in the test thread
            errors.append(exc)

    thread = threading.Thread(target=target, name="ingest", daemon=True)
    thread.start()
    try:
        yield service
    finally:
        service.stop()
        thread.join(30)
        assert not thread.is_alive(), "ingest thread did not stop within 30 s"
    if errors:
        raise errors[0]


class IngestProcess:
    """``python -m sapwood.ingest`` as a child process (for kill -9 / SIGTERM / rebalance tests)."""

    def __init__(self, url: str, bootstrap: str, topic: str, group: str, log: Path, *, batch_size: int = 50,
                 instance_id: str | None = None, application_name: str = "sapwood-ingest-test") -> None:
        self.args = [sys.executable, "-m", "sapwood.ingest", "--database-url", url, "--bootstrap", bootstrap,
                     "--topic", topic, "--group", group, "--batch-size", str(batch_size), "--partitions", "0",
                     "--dead-letter-topic", f"{topic}.dlq", "--application-name", application_name]
        if instance_id:
            self.args += ["--instance-id", instance_id]
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> IngestProcess:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(self.args, stdout=out, stderr=subprocess.STDOUT)
        return self

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)

    def terminate(self, timeout: float = 30) -> int:
        """SIGTERM and wait; returns the exit code."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def ensure_dead(self) -> None:
        if self.alive():
            self.kill()


def store_event_ids(engine: sa.Engine) -> list[str]:
    with engine.connect() as conn:
        return [str(r[0]) for r in conn.execute(sa.select(t.events.c.event_id))]


def count_rows(engine: sa.Engine, table: sa.Table) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(table)).scalar_one())


def caught_up(engine: sa.Engine, bootstrap: str, topic: str, group: str) -> bool:
    """Stored offsets equal the log-end offsets of every non-empty partition."""
    ends = end_offsets(bootstrap, topic)
    with engine.connect() as conn:
        stored = offset_store(conn).read(conn, group, topic)
    return all(stored.get(p, 0) == end for p, end in ends.items())


def check_exactly_once(store: Store, acked: list[Event], *, bootstrap: str, topic: str, group: str,
                       dead_letters: int = 0) -> None:
    """Store == the producer's ledger: 0 lost, 0 duplicated, offsets at the end, projections rebuildable."""
    ids = store_event_ids(store.engine)
    assert len(ids) == len(set(ids))
    acked_ids = {e.event_id for e in acked}
    missing = acked_ids - set(ids)
    assert not missing, f"{len(missing)} acknowledged events are not in the store"
    extra = set(ids) - acked_ids
    assert not extra, f"{len(extra)} stored events were never acknowledged"
    assert count_rows(store.engine, t.dead_letters) == dead_letters
    assert caught_up(store.engine, bootstrap, topic, group)
    before = store.projection_hash()
    store.rebuild_projections()
    assert store.projection_hash() == before, "projections differ from a rebuild from the events"


class Ledger:
    """Thread-safe list of acknowledged events (a transport's ``on_delivery``)."""

    def __init__(self) -> None:
        self.acked: list[Event] = []
        self.failed: list[tuple[Event, BaseException]] = []
        self._lock = threading.Lock()

    def __call__(self, event: Event, error: BaseException | None) -> None:
        with self._lock:
            if error is None:
                self.acked.append(event)
            else:
                self.failed.append((event, error))


def raw_producer(bootstrap: str, **kw: Any) -> Any:
    return KafkaProducer(bootstrap_servers=bootstrap, client_id="sapwood-test-raw", **kw)


def produce(bootstrap: str, topic: str, records: Iterable[tuple[bytes, bytes | None]], *,
            partition: int | None = None, **producer_kw: Any) -> None:
    """Send ``(value, key)`` records with a plain producer (``producer_kw``: compression, batching), flushed."""
    producer = raw_producer(bootstrap, **producer_kw)
    try:
        for value, key in records:
            producer.send(topic, value=value, key=key, partition=partition)
        producer.flush(60)
    finally:
        producer.close()


def produce_events(bootstrap: str, topic: str, events: Iterable[Event], *, partition: int | None = 0,
                   **producer_kw: Any) -> None:
    """Send encoded events keyed by execution id, as the recorder's Kafka transport does."""
    produce(bootstrap, topic, ((encode(ev), ev.execution_id.encode()) for ev in events), partition=partition,
            **producer_kw)


def ingest_until_caught_up(store: Store, url: str, bootstrap: str, topic: str, **config_kw: Any) -> IngestConfig:
    """Run a real ingest on ``topic`` until its stored offsets reach the log end; the config it ran with."""
    config = ingest_config(url, bootstrap, topic, **config_kw)
    with running_ingest(config):
        wait_until(lambda: caught_up(store.engine, bootstrap, topic, config.group), 60, "ingest to catch up")
    return config


def dead_letters_and_stored(engine: sa.Engine, *columns: str) -> tuple[list[sa.Row[Any]], set[str]]:
    """(the dead letters' ``columns``, the ids of the stored events)."""
    with engine.connect() as conn:
        letters = list(conn.execute(sa.select(*(t.dead_letters.c[name] for name in columns))).all())
        stored = {str(r[0]) for r in conn.execute(sa.select(t.events.c.event_id))}
    return letters, stored


class Agent:
    """A simulated agent loop driving an :class:`ExecutionRecorder` like a rollout worker would.

    It keeps the exact input of every call (``inputs``), so a test can compare them with the
    inputs the store reconstructs.
    """

    def __init__(self, recorder: Recorder, rng: np.random.Generator, *, vocab: int = 1000) -> None:
        self.recorder = recorder
        self.rng = rng
        self.vocab = vocab
        self.inputs: dict[str, np.ndarray] = {}

    def tokens(self, n: int) -> np.ndarray:
        return self.rng.integers(0, self.vocab, n, dtype=np.int32)

    def logprobs(self, n: int) -> np.ndarray:
        return -self.rng.exponential(1.0, n).astype(np.float32)

    def _call(self, ex: ExecutionRecorder, input_ids: np.ndarray, kind: str = "action",
              version: int = 0) -> np.ndarray:
        n = int(self.rng.integers(3, 30))
        out = self.tokens(n)
        call = ex.call(input_ids, out, self.logprobs(n), kind=kind, policy_version=version)
        self.inputs[call.call_id] = input_ids.copy()
        return out

    def run(self, task_id: str, *, turns: int = 12, fork_at: int = 4, compact_at: int = 8,
            status: str = "success") -> ExecutionRecorder:
        """One execution: prompt, ``turns`` tool turns, a 2-way fork with a side branch, a compaction."""
        system, task = self.tokens(40), self.tokens(10)
        ex = self.recorder.start(task_id, prompt=np.concatenate([system, task]))
        context = ex.context()
        for turn in range(turns):
            template = self.tokens(2)
            input_ids = np.concatenate([context, template])
            if turn == compact_at:
                summary = self._call(ex, input_ids, kind="summary", version=turn // 5)
                context = np.concatenate([task, summary])
                ex.compact(context)
                continue
            out = self._call(ex, input_ids, version=turn // 5)
            obs = self.tokens(int(self.rng.integers(5, 60)))
            ex.observe(obs)
            context = np.concatenate([input_ids, out, obs])
            if turn == fork_at:
                fork_point = ex.head
                ex.fork(2, at=fork_point)
                side = context
                for _ in range(2):  # the other branch, then back to the main one
                    side_in = np.concatenate([side, self.tokens(2)])
                    side_out = self._call(ex, side_in, version=turn // 5)
                    side_obs = self.tokens(9)
                    ex.observe(side_obs)
                    side = np.concatenate([side_in, side_out, side_obs])
            if turn == 2:  # a retry whose input the engine re-rendered (last token differs): a new branch
                self._call(ex, np.concatenate([context[:-1], self.tokens(3)]), version=turn // 5)
        if status == "timeout":
            ex.score(0.4, components={"tests_passed": 0.4}, scorer="unit-tests")
            ex.finish("timeout", reward=0.4, message="turn budget")
        else:
            ex.finish(status, reward=float(self.rng.uniform(0, 1)))
        return ex

