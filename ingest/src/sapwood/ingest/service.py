"""The ingest service: Kafka consumer group → PostgreSQL event store, exactly once.

Per batch, ONE database transaction:

1. locks the group's stored offsets of the batch's partitions and checks each equals the
   position this process reads from (compare-and-set: a zombie or a process that lost
   its partitions in a rebalance cannot apply the same records twice; on mismatch the
   partition is re-seeked to the stored offset);
2. decodes the records; applies the events with ``apply_events(..., strict=False)``;
3. writes undecodable, oversized and rejected records to ``dead_letters``;
4. stores each partition's next offset.

After the commit: the dead letters are copied to the dead-letter topic and the offsets to
Kafka (both best effort; the store is the truth). On partition assignment the consumer
seeks to the stored offsets. A lost database connection rolls back the batch, disposes
the connection pool and re-seeks every partition to its stored offset; a batch that fails
for another reason is retried one record per transaction, and a record that still fails
alone is dead-lettered, so a partition never stalls on one bad record.

Nothing is inflated past a bound: a record's payload stops at ``max_event_bytes`` (the codec) and a
compressed Kafka record batch at ``max_batch_bytes`` (:mod:`kafka_bounds`); both become ``too_large``
dead letters. Each dead letter is logged once (:func:`log_dead_letters`). Processes join the group with a
static instance id derived from the host by default (:mod:`membership`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import psycopg
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import make_url

from sapwood.ingest import kafka_bounds
from sapwood.ingest.deadletters import DeadLetter, DeadLetterPublisher, log_dead_letters, write_dead_letters
from sapwood.ingest.membership import AUTO, DYNAMIC, InstanceLock, resolve_instance_id
from sapwood.ingest.metrics import IngestMetrics
from sapwood.ingest.offsets import load_offsets, store_offsets
from sapwood.ingest.topics import ensure_topics
from sapwood.platform.apply import ApplyResult, apply_events
from sapwood.platform.codec import decode
from sapwood.platform.errors import SapwoodError, StoreError, StoreUnavailableError, ValidationError
from sapwood.platform.events import Event
from sapwood.platform.settings import Settings
from sapwood.platform.store import Store, make_engine

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka import ConsumerRebalanceListener, KafkaConsumer, TopicPartition
    from kafka.structs import OffsetAndMetadata

log = logging.getLogger(__name__)


@dataclass
class IngestConfig:
    """Settings of one ingest process."""

    database_url: str
    """SQLAlchemy URL of the store (PostgreSQL in production)."""
    bootstrap: str
    """Kafka ``host:port``."""
    topic: str = "sapwood.events"
    group: str = "sapwood-ingest"
    """Consumer group; processes of one group split the topic's partitions."""
    dead_letter_topic: str | None = "sapwood.dead-letters"
    """Topic that gets a copy of every dead letter (None: table only)."""
    batch_size: int = 500
    """Most records per transaction."""
    batch_wait_ms: int = 50
    """After a poll, keep polling this long to fill the transaction up to ``batch_size``."""
    max_event_bytes: int = 1_000_000
    """Records larger than this are dead-lettered as ``too_large`` without decoding, and so are records
    whose payload decompresses to more (never inflated past this bound)."""
    max_batch_bytes: int | None = None
    """Most bytes a compressed Kafka record batch may inflate to (None: max(64 MiB, 4 × max_event_bytes));
    a larger batch's offsets are dead-lettered as ``too_large`` (see :mod:`kafka_bounds`)."""
    partitions: int = 8
    """Partitions of the topics when this process creates them (0: never create topics)."""
    instance_id: str | None = None
    """Static group membership: a restarted process with the same id gets its partitions back at once.
    ``"auto"`` derives ``sapwood-ingest-<host>-<index>`` (the CLI's default, see :mod:`membership`);
    None: dynamic membership (a stopped member's partitions move at once, a restarted one rejoins)."""
    application_name: str = "sapwood-ingest"
    """PostgreSQL ``application_name`` of the ingest's connections."""
    poll_timeout_ms: int = 200
    session_timeout_ms: int = 10_000
    heartbeat_interval_ms: int = 1_000
    lag_interval_s: float = 2.0
    """How often the lag gauge is refreshed (asks the broker for log-end offsets)."""
    retry_backoff_s: float = 0.2
    max_backoff_s: float = 5.0
    metrics_port: int | None = None
    metrics_addr: str = "127.0.0.1"
    """Interface of the ``/metrics`` server (loopback unless configured, e.g. ``0.0.0.0``)."""
    commit_to_kafka: bool = True
    """Also commit offsets to Kafka after the database commit (for lag tooling)."""
    migrate: bool = True
    cache_nodes: int = 200_000
    consumer_config: dict[str, Any] = field(default_factory=dict)
    """Extra kafka-python ``KafkaConsumer`` settings."""

    @classmethod
    def from_settings(cls, settings: Settings | None = None, **overrides: Any) -> IngestConfig:
        """Defaults from ``SAPWOOD_*`` settings; ``overrides`` that are None are ignored."""
        s = settings or Settings()
        values: dict[str, Any] = {
            "database_url": s.database_url,
            "bootstrap": s.kafka_bootstrap,
            "topic": s.kafka_topic,
            "group": s.ingest_group,
            "dead_letter_topic": s.kafka_dead_letter_topic,
            "batch_size": s.ingest_batch_size,
            "max_event_bytes": s.max_event_bytes,
            "partitions": s.kafka_partitions,
            "metrics_port": s.metrics_port,
            "cache_nodes": s.context_cache_nodes,
            "instance_id": AUTO,
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        if not values["bootstrap"]:
            raise ValueError("ingest needs a Kafka bootstrap server (--bootstrap or SAPWOOD_KAFKA_BOOTSTRAP)")
        return cls(**values)


@dataclass
class IngestStats:
    """Running totals of one service instance."""

    events: int = 0
    tokens: int = 0
    duplicates: int = 0
    dead_letters: int = 0
    batches: int = 0
    retries: int = 0
    db_errors: int = 0
    rebalances: int = 0
    """Partition assignments received: 1 for a lone member that never rebalanced."""
    first_batch_at: float | None = None
    """``time.monotonic()`` when the first batch began (throughput without start-up and group join)."""
    last_commit_at: float | None = None


def _with_connection_params(url: str, application_name: str) -> str:
    parsed = make_url(url)
    if parsed.get_backend_name() != "postgresql":
        return url
    query = {"application_name": application_name, "connect_timeout": "5", **parsed.query}
    return parsed.update_query_dict(query).render_as_string(hide_password=False)


class _Listener(ConsumerRebalanceListener):
    def __init__(self, service: IngestService) -> None:
        self.service = service

    # An exception escaping a listener makes kafka-python log a traceback at ERROR (on close too):
    # each callback logs its own failure as a warning instead.
    def on_partitions_revoked(self, revoked: Iterable[TopicPartition]) -> None:
        self._guard(self.service._revoke, revoked)

    def on_partitions_lost(self, lost: Iterable[TopicPartition]) -> None:
        self._guard(self.service._revoke, lost)

    def on_partitions_assigned(self, assigned: Iterable[TopicPartition]) -> None:
        self._guard(self.service._assign, assigned)

    @staticmethod
    def _guard(fn: Any, tps: Iterable[TopicPartition]) -> None:
        try:
            fn(tps)
        except Exception as exc:
            log.warning("rebalance callback %s failed: %s: %s", fn.__name__, type(exc).__name__, exc)


_NOT_ASSIGNED = object()


@dataclass
class _SkippedRecord:
    """Stands for one record of a batch that was never inflated (dead-lettered without its bytes)."""

    offset: int
    value: bytes = b""
    key: bytes | None = None

#: kafka-python 3.0 reports its own teardown races as ERROR, some with a traceback (a read on a transport its
#: other thread just closed; a heartbeat request cancelled by the close): its loggers are quieted while
#: :meth:`IngestService.close` runs, and only then (Sapwood's own close warnings still show).
_TEARDOWN_LOGGERS = ("kafka",)


@contextlib.contextmanager
def _quiet_socket_teardown() -> Iterator[None]:
    loggers = [logging.getLogger(name) for name in _TEARDOWN_LOGGERS]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def connection_lost(exc: BaseException) -> bool:
    """Whether ``exc`` (or an error it was raised from) means the database connection is gone."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, StoreUnavailableError | sa_exc.DisconnectionError | sa_exc.OperationalError
                      | sa_exc.InterfaceError | psycopg.OperationalError | psycopg.InterfaceError):
            return True
        if isinstance(cur, sa_exc.DBAPIError) and cur.connection_invalidated:
            return True
        cur = cur.__cause__ or cur.__context__
    return False


def consumer_settings(cfg: IngestConfig, client_id: str, instance_id: str | None = None) -> dict[str, Any]:
    """The ``KafkaConsumer`` settings of an ingest process (manual commits: offsets live in the store);
    ``instance_id``: the resolved static membership id (default: ``cfg.instance_id`` unless it is "auto")."""
    if instance_id is None and cfg.instance_id and cfg.instance_id.lower() not in {AUTO, *DYNAMIC}:
        instance_id = cfg.instance_id
    settings: dict[str, Any] = {
        "bootstrap_servers": cfg.bootstrap,
        "group_id": cfg.group,
        "client_id": client_id,
        "group_instance_id": instance_id,
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest",
        "max_poll_records": cfg.batch_size,
        "session_timeout_ms": cfg.session_timeout_ms,
        "heartbeat_interval_ms": cfg.heartbeat_interval_ms,
        "fetch_max_wait_ms": 100,
        "max_partition_fetch_bytes": max(1024 * 1024, cfg.max_event_bytes + 64 * 1024),
        # a partition set missed by the first assignment is noticed within this delay (see _settle_group)
        "metadata_max_age_ms": 30_000,
        "reconnect_backoff_max_ms": 1000,  # back within a second of a broker restart
    }
    settings.update(cfg.consumer_config)
    return settings


class IngestService:
    """One ingest process: ``run()`` consumes until :meth:`stop` (SIGTERM in the CLI)."""

    def __init__(self, config: IngestConfig, *, metrics: IngestMetrics | None = None) -> None:
        if config.batch_size < 1:
            raise ValueError(f"batch_size must be ≥ 1, got {config.batch_size}")
        self.config = config
        self.metrics = metrics or IngestMetrics()
        self.stats = IngestStats()
        #: Partition → stored next offset this process reads from (None: nothing stored yet).
        self.positions: dict[TopicPartition, int | None] = {}
        #: Last measured lag per partition (log-end offset − stored offset).
        self.lag: dict[int, int] = {}
        self._unsynced: set[TopicPartition] = set()
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._backoff = config.retry_backoff_s
        self._next_sync = 0.0
        self._next_lag = 0.0
        self.store: Store | None = None
        self.consumer: Any = None
        self.dlq: DeadLetterPublisher | None = None
        self.client_id = f"sapwood-ingest-{socket.gethostname()}-{os.getpid()}"
        self._instance: InstanceLock | None = None

    # -- lifecycle ----------------------------------------------------------------------------------
    def stop(self) -> None:
        """Ask :meth:`run` to finish its current batch, commit, leave the group and return."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def committed_offsets(self) -> dict[int, int | None]:
        """Partition → the next offset stored for it, as this process last read it on assignment or
        committed it (None: nothing stored yet), for the partitions it holds now; safe to call from
        another thread."""
        with self._lock:
            return {tp.partition: offset for tp, offset in self.positions.items() if tp.topic == self.config.topic}

    def run(self) -> None:
        """Consume and apply until :meth:`stop` is called."""
        try:
            self.open()
            while not self._stop.is_set():
                self.step()
        finally:
            self.close()

    def open(self) -> None:
        cfg = self.config
        url = _with_connection_params(cfg.database_url, cfg.application_name)
        self.store = Store(make_engine(url), cache_nodes=cfg.cache_nodes)
        if cfg.migrate:
            self._migrate()
        if cfg.partitions > 0:
            topics = {cfg.topic: cfg.partitions}
            if cfg.dead_letter_topic:
                topics[cfg.dead_letter_topic] = 1
            ensure_topics(cfg.bootstrap, topics, max_event_bytes=cfg.max_event_bytes)
        # record batches are inflated by poll()'s caller: bound them in this thread (the one that runs step())
        kafka_bounds.install(cfg.max_batch_bytes or max(64 << 20, 4 * cfg.max_event_bytes))
        self._instance = resolve_instance_id(cfg.instance_id, cfg.group)
        instance_id = self._instance.value if self._instance is not None else None
        self.consumer = KafkaConsumer(**consumer_settings(cfg, self.client_id, instance_id))
        self.consumer.subscribe([cfg.topic], listener=_Listener(self))
        # Know the topic's partitions before joining, so the first assignment is not empty. Subscribed
        # first, so this metadata also reaches the group coordinator: kafka-python compares the metadata
        # the leader assigned from with later metadata, and a snapshot taken before any metadata
        # (subscribing afterwards) makes every fresh start rebalance once more right after its first batch.
        deadline = time.monotonic() + 30
        while not self.consumer.partitions_for_topic(cfg.topic) and time.monotonic() < deadline:
            time.sleep(0.2)
        if cfg.dead_letter_topic:
            self.dlq = DeadLetterPublisher(cfg.bootstrap, cfg.dead_letter_topic)
        if cfg.metrics_port is not None:
            self.metrics.serve(cfg.metrics_port, cfg.metrics_addr)
        log.info("ingest %s (instance %s): group %s, topic %s, store %s", self.client_id, instance_id or "dynamic",
                 cfg.group, cfg.topic,
                 make_url(cfg.database_url).render_as_string(hide_password=True))

    def _migrate(self) -> None:
        assert self.store is not None
        for attempt in range(3):
            try:
                self.store.migrate()
                return
            except StoreError:
                if attempt == 2:
                    raise
                time.sleep(1.0)  # another process may be running the same migration

    def close(self) -> None:
        """Leave the group and release everything (safe to call twice)."""
        with _quiet_socket_teardown():
            self._close()

    def _close(self) -> None:
        if self.consumer is not None:
            try:
                self.consumer.close(autocommit=False)
            except Exception as exc:
                log.warning("consumer close failed: %s", exc)
            self.consumer = None
        if self.dlq is not None:
            self.dlq.close()
            self.dlq = None
        if self.store is not None:
            self.store.close()
            self.store = None
        self.metrics.close()
        if self._instance is not None:
            self._instance.release()
            self._instance = None

    # -- partition assignment -----------------------------------------------------------------------
    def _assign(self, assigned: Iterable[TopicPartition]) -> None:
        self.stats.rebalances += 1
        self.metrics.rebalances.inc()
        tps = [tp for tp in assigned if tp.topic == self.config.topic]
        with self._lock:
            for tp in tps:
                self.positions[tp] = None
                self._unsynced.add(tp)
        try:
            self._sync(tps)
        except Exception as exc:  # database down: keep them paused, the loop retries
            log.warning("cannot read stored offsets for %s (%s); partitions paused", tps, exc)
            self._pause(tps)
        log.info("assigned %s", sorted(tp.partition for tp in tps))

    def _pause(self, tps: Iterable[TopicPartition]) -> None:
        assigned = self.consumer.assignment()
        live = [tp for tp in tps if tp in assigned]
        if live:
            self.consumer.pause(*live)

    def _revoke(self, revoked: Iterable[TopicPartition]) -> None:
        with self._lock:
            for tp in revoked:
                self.positions.pop(tp, None)
                self._unsynced.discard(tp)
                self.lag.pop(tp.partition, None)
                with contextlib.suppress(KeyError):
                    self.metrics.lag.remove(tp.topic, str(tp.partition))

    def _sync(self, tps: list[TopicPartition]) -> None:
        """Seek ``tps`` to their stored offsets (the beginning when nothing is stored)."""
        if not tps:
            return
        assert self.store is not None
        with self.store.transaction() as conn:
            stored = load_offsets(conn, self.config.group, self.config.topic, [tp.partition for tp in tps])
        assigned = self.consumer.assignment()
        with self._lock:
            live = [tp for tp in tps if tp in self.positions and tp in assigned]
            for tp in live:
                offset = stored.get(tp.partition)
                if offset is None:
                    self.consumer.seek_to_beginning(tp)
                else:
                    self.consumer.seek(tp, offset)
                self.positions[tp] = offset
                self._unsynced.discard(tp)
            if live:
                self.consumer.resume(*live)

    def _resync_pending(self) -> None:
        if time.monotonic() < self._next_sync:
            return
        with self._lock:
            pending = [tp for tp in self._unsynced if tp in self.positions]
        try:
            self._sync(pending)
            self._backoff = self.config.retry_backoff_s
        except Exception as exc:
            log.warning("stored offsets still unreadable (%s); retrying in %.1f s", exc, self._backoff)
            self._next_sync = time.monotonic() + self._backoff
            self._backoff = min(self._backoff * 2, self.config.max_backoff_s)

    def _db_down(self, exc: BaseException) -> None:
        """Roll-back path: drop pooled connections, pause, re-seek to stored offsets when the DB answers."""
        self.stats.db_errors += 1
        self.stats.retries += 1
        self.metrics.retries.inc()
        log.warning("database error (%s); re-reading stored offsets", exc)
        assert self.store is not None
        self.store.engine.dispose()
        with self._lock:
            tps = list(self.positions)
            self._unsynced.update(tps)
        self._pause(tps)
        self._next_sync = time.monotonic() + self._backoff
        self._backoff = min(self._backoff * 2, self.config.max_backoff_s)

    # -- the loop -----------------------------------------------------------------------------------
    def _settle_group(self) -> None:
        """Finish a pending rebalance before polling for records.

        Works around kafka-python 3.0: when ``poll()``'s timeout expires while JoinGroup/SyncGroup
        is in flight and the join completes before the next ``poll()``, its result is dropped
        and a new join starts; on a busy machine the group leader can loop like that for ever.
        Driving the join with a long timeout while a rejoin is needed avoids the window.
        """
        coordinator = getattr(self.consumer, "_coordinator", None)
        need_rejoin = getattr(coordinator, "need_rejoin", None)
        ensure_active = getattr(coordinator, "ensure_active_group", None)
        if need_rejoin is None or ensure_active is None:
            return
        deadline = time.monotonic() + 60
        while not self._stop.is_set() and time.monotonic() < deadline and need_rejoin():
            try:
                ensure_active(timeout_ms=5000)
            except Exception as exc:
                log.warning("rejoining the group failed: %s", exc)
                return

    def step(self) -> int:
        """Poll once and apply what came; returns the records handled."""
        self._settle_group()
        if self._unsynced:
            self._resync_pending()
        try:
            polled = self._poll_batch()
        except kafka_bounds.BatchTooLargeError as exc:
            self._skip_batch(exc)
            return 0
        except Exception as exc:
            log.warning("poll failed: %s", exc)
            time.sleep(self.config.retry_backoff_s)
            return 0
        with self._lock:
            batch = {tp: recs for tp, recs in polled.items()
                     if recs and tp in self.positions and tp not in self._unsynced}
        if batch:
            self._process(batch)
        self._report_lag()
        return sum(len(r) for r in batch.values())

    def _poll_batch(self) -> dict[TopicPartition, list[Any]]:
        """Records of one transaction: a poll, topped up for ``batch_wait_ms`` while under ``batch_size``."""
        cfg = self.config
        polled = {tp: list(recs) for tp, recs in
                  self.consumer.poll(timeout_ms=cfg.poll_timeout_ms, max_records=cfg.batch_size).items()}
        n = sum(len(r) for r in polled.values())
        deadline = time.monotonic() + cfg.batch_wait_ms / 1000
        while 0 < n < cfg.batch_size and not self._rebalance_pending():
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if remaining_ms <= 0:
                break
            more = self.consumer.poll(timeout_ms=remaining_ms, max_records=cfg.batch_size - n)
            if not more:
                break
            for tp, recs in more.items():
                polled.setdefault(tp, []).extend(recs)
                n += len(recs)
        return polled

    def _skip_batch(self, exc: kafka_bounds.BatchTooLargeError) -> None:
        """Dead-letter every offset of a record batch that inflates past the bound (``too_large``, no payload:
        the batch was never inflated), store the offset after it and seek there."""
        tp = exc.partition
        with self._lock:
            expected = self.positions.get(tp, _NOT_ASSIGNED)
        if tp is None or expected is _NOT_ASSIGNED:
            log.warning("poll failed: %s (partition not held)", exc)
            time.sleep(self.config.retry_backoff_s)
            return
        first = max(exc.base_offset, expected if isinstance(expected, int) else 0)
        records = [_SkippedRecord(o) for o in range(first, exc.last_offset + 1)]
        log.error("partition %s: %s; dead-lettering offsets %d..%d", tp.partition, exc, first, exc.last_offset)
        try:
            mismatched = self._commit({tp: records}, poison=("too_large", str(exc)))
        except Exception as err:
            if connection_lost(err):
                self._db_down(err)
                return
            raise
        if tp not in mismatched:
            with self._lock:
                if tp in self.positions:
                    self.consumer.seek(tp, exc.last_offset + 1)

    def _rebalance_pending(self) -> bool:
        need_rejoin = getattr(getattr(self.consumer, "_coordinator", None), "need_rejoin", None)
        return bool(need_rejoin()) if need_rejoin is not None else False

    def _process(self, batch: dict[TopicPartition, list[Any]]) -> None:
        try:
            self._commit(batch)
            self._backoff = self.config.retry_backoff_s
            return
        except Exception as exc:
            if connection_lost(exc):
                self._db_down(exc)
                return
            # a write race (two processes storing one new span) or one bad record
            self.stats.retries += 1
            self.metrics.retries.inc()
            log.warning("batch failed (%s: %s); retrying one record per transaction", type(exc).__name__, exc)
        for tp, records in batch.items():
            for record in records:
                error: BaseException | None = None
                for _attempt in range(2):
                    try:
                        mismatched = self._commit({tp: [record]})
                        error = None
                        break
                    except Exception as exc:
                        if connection_lost(exc):
                            self._db_down(exc)
                            return
                        error = exc
                if error is not None:
                    reason = "store_error" if isinstance(error, SapwoodError) else "internal_error"
                    log.error("record %s/%s@%s fails on its own; dead-lettered (%s)", tp.topic, tp.partition,
                              record.offset, error)
                    try:
                        mismatched = self._commit({tp: [record]}, poison=(reason, f"{type(error).__name__}: {error}"))
                    except Exception as exc:
                        self._db_down(exc)
                        return
                if mismatched:
                    break  # re-seeked: the rest of this partition's records will be fetched again

    def _commit(self, batch: dict[TopicPartition, list[Any]], *,
                poison: tuple[str, str] | None = None) -> set[TopicPartition]:
        """Apply ``batch`` and advance the offsets in one transaction; returns partitions re-seeked."""
        assert self.store is not None
        cfg = self.config
        t0 = time.perf_counter()
        if self.stats.first_batch_at is None:
            self.stats.first_batch_at = time.monotonic()
        letters: list[DeadLetter] = []
        events: list[Event] = []
        origin: dict[int, tuple[str, Any]] = {}
        new_offsets: dict[TopicPartition, int] = {}
        mismatched: dict[TopicPartition, int | None] = {}
        result = ApplyResult()
        with self.store.transaction() as conn:
            stored = load_offsets(conn, cfg.group, cfg.topic, [tp.partition for tp in batch], for_update=True)
            for tp, records in batch.items():
                with self._lock:
                    expected = self.positions.get(tp, _NOT_ASSIGNED)
                if expected is _NOT_ASSIGNED:
                    continue
                have = stored.get(tp.partition)
                if have != expected:
                    mismatched[tp] = have
                    continue
                todo = [r for r in records if expected is None or r.offset >= expected]
                if not todo:
                    continue
                new_offsets[tp] = todo[-1].offset + 1
                for r in todo:
                    source = f"kafka:{tp.topic}/{tp.partition}@{r.offset}"
                    value = bytes(r.value or b"")
                    if poison is not None:
                        letters.append(DeadLetter(poison[0], poison[1], value, source, r.key))
                        continue
                    if len(value) > cfg.max_event_bytes:
                        letters.append(DeadLetter("too_large", f"record of {len(value):,} bytes exceeds "
                                                  f"max_event_bytes={cfg.max_event_bytes:,}", value, source, r.key))
                        continue
                    try:
                        event = decode(value, validate=False, max_bytes=cfg.max_event_bytes)
                    except ValidationError as exc:
                        letters.append(DeadLetter(exc.reason, str(exc), value, source, r.key, exc.event_id))
                        continue
                    except Exception as exc:  # malformed beyond what the codec anticipates
                        letters.append(DeadLetter("decode", f"{type(exc).__name__}: {exc}", value, source, r.key))
                        continue
                    events.append(event)
                    origin[id(event)] = (source, r)
            if events:
                result = apply_events(conn, events, cache=self.store.cache, strict=False)
            for rej in result.rejected:
                source, r = origin[id(rej.event)]
                letters.append(DeadLetter(getattr(rej.error, "reason", "invalid"), str(rej.error), bytes(r.value),
                                          source, r.key, rej.event.event_id, rej.event.execution_id))
            if letters:
                write_dead_letters(conn, letters)
            if new_offsets:
                store_offsets(conn, cfg.group, cfg.topic, {tp.partition: o for tp, o in new_offsets.items()},
                              existing=stored)
        # committed
        self.store.cache.merge(result.new_states)
        with self._lock:
            for tp, offset in new_offsets.items():
                if tp in self.positions:
                    self.positions[tp] = offset
        self._account(result, letters, time.perf_counter() - t0, bool(new_offsets))
        for tp, have in mismatched.items():
            self._reseek(tp, have)
        log_dead_letters(letters)
        if letters and self.dlq is not None:
            self.dlq.publish(letters)
        if cfg.commit_to_kafka and new_offsets:
            try:
                self.consumer.commit_async({tp: OffsetAndMetadata(o, "", -1) for tp, o in new_offsets.items()})
            except Exception as exc:
                log.debug("kafka offset commit skipped: %s", exc)
        return set(mismatched)

    def _reseek(self, tp: TopicPartition, offset: int | None) -> None:
        log.warning("partition %s: stored offset %s differs from this process's position %s; re-seeking",
                    tp.partition, offset, self.positions.get(tp))
        with self._lock:
            if tp not in self.positions:
                return
            self.positions[tp] = offset
            if offset is None:
                self.consumer.seek_to_beginning(tp)
            else:
                self.consumer.seek(tp, offset)

    def _account(self, result: ApplyResult, letters: list[DeadLetter], seconds: float, advanced: bool) -> None:
        n_events, tokens = len(result.applied), result.tokens
        self.stats.events += n_events
        self.stats.tokens += tokens
        self.stats.duplicates += result.duplicates
        self.stats.dead_letters += len(letters)
        self.metrics.events.inc(n_events)
        self.metrics.tokens.inc(tokens)
        self.metrics.duplicates.inc(result.duplicates)
        for dl in letters:
            self.metrics.dead_letters.labels(dl.reason).inc()
        if advanced:
            self.stats.last_commit_at = time.monotonic()
            self.stats.batches += 1
            self.metrics.batches.inc()
            self.metrics.apply_seconds.observe(seconds)

    def _report_lag(self, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now < self._next_lag:
            return
        self._next_lag = now + self.config.lag_interval_s
        with self._lock:
            positions = dict(self.positions)
        if not positions:
            return
        try:
            ends = self.consumer.end_offsets(list(positions), timeout_ms=2000)
        except Exception as exc:
            log.debug("lag not measured: %s", exc)
            return
        for tp, end in ends.items():
            lag = max(0, int(end) - (positions.get(tp) or 0))
            self.lag[tp.partition] = lag
            self.metrics.lag.labels(tp.topic, str(tp.partition)).set(lag)


__all__ = ["IngestConfig", "IngestService", "IngestStats", "consumer_settings"]
