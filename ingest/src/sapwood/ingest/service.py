"""The ingest service: Kafka consumer group → the event store, exactly once.

It wires five components, each with one job:

- :class:`~sapwood.ingest.source.KafkaSource` — the consumer: group membership, rebalances, polling, seeking;
- :class:`~sapwood.ingest.committer.OffsetCommitter` — positions held, stored offsets advanced by compare-and-set;
- :func:`~sapwood.ingest.record_decoder.decode_records` — records → events, or dead letters;
- :class:`~sapwood.ingest.classifier.DeadLetterClassifier` — a failure: reconnect, retry or dead-letter;
- :class:`~sapwood.ingest.metrics.IngestSensor` — totals, lag and Prometheus metrics.

Per batch, ONE database transaction: the committer locks the batch's stored offsets and keeps the records
of partitions whose stored offset equals this process's position (on mismatch the partition is re-seeked to
the stored offset); the records are decoded and applied with ``apply_events(..., strict=False)``;
undecodable, oversized and rejected records go to ``dead_letters``; each partition's next offset is stored.
After the commit: the dead letters are copied to the dead-letter topic and the offsets to Kafka (both best
effort; the store is the truth). On partition assignment the consumer seeks to the stored offsets. A lost
database connection rolls back the batch, disposes the connection pool and re-seeks every partition to its
stored offset; a batch that fails for another reason is retried one record per transaction, and a record
that still fails alone is dead-lettered, so a partition never stalls on one bad record.

Nothing is inflated past a bound: a record's payload stops at ``max_event_bytes`` (the codec) and a
compressed Kafka record batch at ``max_batch_bytes`` (:mod:`kafka_bounds`); both become ``too_large``
dead letters. Each dead letter is logged once (:func:`log_dead_letters`). Processes join the group with a
static instance id derived from the host by default (:mod:`membership`).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import Any

from sqlalchemy.engine import make_url

from sapwood.ingest import kafka_bounds
from sapwood.ingest.classifier import DeadLetterClassifier, Verdict, connection_lost
from sapwood.ingest.committer import NOT_ASSIGNED, OffsetCommitter
from sapwood.ingest.config import IngestConfig
from sapwood.ingest.deadletters import DeadLetterPublisher, log_dead_letters, write_dead_letters
from sapwood.ingest.liveness import Liveness
from sapwood.ingest.membership import InstanceLock, resolve_instance_id
from sapwood.ingest.metrics import IngestMetrics, IngestSensor, IngestStats
from sapwood.ingest.record_decoder import SkippedRecord, decode_records
from sapwood.ingest.source import KafkaSource, TopicPartition, quiet_socket_teardown
from sapwood.ingest.topics import ensure_topics
from sapwood.platform.apply import ApplyResult, apply_events
from sapwood.platform.faults import fault_point
from sapwood.platform.storage.engines import make_engine
from sapwood.platform.store import Store

log = logging.getLogger(__name__)



class IngestService:
    """One ingest process: ``run()`` consumes until :meth:`stop` (SIGTERM in the CLI)."""

    def __init__(self, config: IngestConfig, *, metrics: IngestMetrics | None = None) -> None:
        if config.batch_size < 1:
            raise ValueError(f"batch_size must be ≥ 1, got {config.batch_size}")
        self.config = config
        self.liveness = Liveness(config.stall_after_s)
        self.sensor = IngestSensor(metrics, lag_interval_s=config.lag_interval_s, liveness=self.liveness)
        self.client_id = f"sapwood-ingest-{socket.gethostname()}-{os.getpid()}"
        self.source = KafkaSource(config, self.client_id, on_assigned=self._assign, on_revoked=self._revoke)
        self.committer = OffsetCommitter(config.group, config.topic, self.source,
                                         commit_to_kafka=config.commit_to_kafka)
        self.classifier = DeadLetterClassifier()
        self.store: Store | None = None
        self.dlq: DeadLetterPublisher | None = None
        self._stop = threading.Event()
        self._backoff = config.retry_backoff_s
        self._next_sync = 0.0
        self._instance: InstanceLock | None = None

    # -- what tests, benches and tools read ---------------------------------------------------------
    @property
    def stats(self) -> IngestStats:
        return self.sensor.stats

    @property
    def metrics(self) -> IngestMetrics:
        return self.sensor.metrics

    @property
    def lag(self) -> dict[int, int]:
        """Last measured lag per partition (log-end offset − stored offset)."""
        return self.sensor.lag

    @property
    def positions(self) -> dict[TopicPartition, int | None]:
        """Partition → stored next offset this process reads from (None: nothing stored yet)."""
        return self.committer.positions

    @property
    def consumer(self) -> Any:
        """The kafka-python consumer (None before :meth:`open` and after :meth:`close`)."""
        return self.source.consumer

    def committed_offsets(self) -> dict[int, int | None]:
        """Partition → the next offset stored for it, as this process last read it on assignment or
        committed it (None: nothing stored yet), for the partitions it holds now; safe to call from
        another thread."""
        return self.committer.held()

    # -- lifecycle ----------------------------------------------------------------------------------
    def stop(self) -> None:
        """Ask :meth:`run` to finish its current batch, commit, leave the group and return."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

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
        engine = make_engine(cfg.database_url, application_name=cfg.application_name, connect_timeout_s=5)
        self.store = Store(engine, cache_nodes=cfg.cache_nodes)
        self.committer.bind(self.store)
        if cfg.migrate:
            self._migrate()
        if cfg.partitions > 0:
            topics = {cfg.topic: cfg.partitions}
            if cfg.dead_letter_topic:
                topics[cfg.dead_letter_topic] = 1
            ensure_topics(cfg.bootstrap, topics, max_event_bytes=cfg.max_event_bytes)
        self._instance = resolve_instance_id(cfg.instance_id, cfg.group)
        instance_id = self._instance.value if self._instance is not None else None
        self.source.open(instance_id)
        if cfg.dead_letter_topic:
            self.dlq = DeadLetterPublisher(cfg.bootstrap, cfg.dead_letter_topic)
        if cfg.metrics_port is not None:
            self.sensor.serve(cfg.metrics_port, cfg.metrics_addr)
        log.info("ingest %s (instance %s): group %s, topic %s, store %s", self.client_id, instance_id or "dynamic",
                 cfg.group, cfg.topic, make_url(cfg.database_url).render_as_string(hide_password=True))

    def _migrate(self) -> None:
        """Upgrade the schema; processes started at once wait for each other (the store's migration lock)."""
        assert self.store is not None
        self.store.migrate()

    def close(self) -> None:
        """Leave the group and release everything (safe to call twice)."""
        with quiet_socket_teardown():
            self.source.close()
            if self.dlq is not None:
                self.dlq.close()
                self.dlq = None
            if self.store is not None:
                self.store.close()
                self.store = None
            self.sensor.close()
            if self._instance is not None:
                self._instance.release()
                self._instance = None

    # -- partition assignment (called by the source, on the polling thread) -------------------------
    def _assign(self, tps: list[TopicPartition]) -> None:
        self.sensor.rebalanced()
        self.committer.assign(tps)
        try:
            assert self.store is not None
            self.committer.sync(self.store, tps)
        except Exception as exc:  # database down: keep them paused, the loop retries
            log.warning("cannot read stored offsets for %s (%s); partitions paused", tps, exc)
            self.source.pause(tps)
        log.info("assigned %s", sorted(tp.partition for tp in tps))

    def _revoke(self, tps: list[TopicPartition]) -> None:
        self.committer.revoke(tps)
        for tp in tps:
            self.sensor.partition_revoked(tp.topic, tp.partition)

    def _resync_pending(self) -> None:
        if time.monotonic() < self._next_sync:
            return
        try:
            assert self.store is not None
            self.committer.sync(self.store, self.committer.pending())
            self._backoff = self.config.retry_backoff_s
        except Exception as exc:
            log.warning("stored offsets still unreadable (%s); retrying in %.1f s", exc, self._backoff)
            self._back_off()

    def _back_off(self) -> None:
        self._next_sync = time.monotonic() + self._backoff
        self._backoff = min(self._backoff * 2, self.config.max_backoff_s)

    def _db_down(self, exc: BaseException) -> None:
        """Roll-back path: drop pooled connections, pause, re-seek to stored offsets when the DB answers."""
        self.sensor.retried(db_error=True)
        log.warning("database error (%s); re-reading stored offsets", exc)
        assert self.store is not None
        self.store.engine.dispose()
        self.source.pause(self.committer.unsync_all())
        self._back_off()

    # -- the loop -----------------------------------------------------------------------------------
    def step(self) -> int:
        """Poll once and apply what came; returns the records handled."""
        self.liveness.beat()
        self.source.settle_group(self._stop.is_set)
        if self.committer.unsynced:
            self._resync_pending()
        try:
            polled = self.source.poll_batch()
        except kafka_bounds.UndecodableBatchError as exc:
            self._skip_batch(exc)
            return 0
        except Exception as exc:
            log.warning("poll failed: %s", exc)
            time.sleep(self.config.retry_backoff_s)
            return 0
        batch = self.committer.readable(polled)
        if batch:
            self._process(batch)
        self.sensor.report_lag(self.committer.snapshot(), self.source.end_offsets)
        return sum(len(r) for r in batch.values())

    def _skip_batch(self, exc: kafka_bounds.UndecodableBatchError) -> None:
        """Dead-letter every offset of a record batch ingest cannot read (``exc.reason``: ``too_large`` past
        the inflation bound, with the key and value prefix of each record readable within the bound;
        ``decode`` when no decoder can inflate it, no payload), store the offset after it and seek there."""
        tp = exc.partition
        expected = self.committer.position(tp) if tp is not None else NOT_ASSIGNED
        if expected is NOT_ASSIGNED:
            log.warning("poll failed: %s (partition not held)", exc)
            time.sleep(self.config.retry_backoff_s)
            return
        first = max(exc.base_offset, expected if isinstance(expected, int) else 0)
        known = exc.records if isinstance(exc, kafka_bounds.BatchTooLargeError) else {}
        records = [SkippedRecord(o, known[o].value, known[o].key) if o in known else SkippedRecord(o)
                   for o in range(first, exc.last_offset + 1)]
        log.error("partition %s: %s; dead-lettering offsets %d..%d", tp.partition, exc, first, exc.last_offset)
        try:
            mismatched = self._commit({tp: records}, poison=(exc.reason, str(exc)))
        except Exception as err:
            if connection_lost(err):
                self._db_down(err)
                return
            raise
        if tp not in mismatched:
            self.committer.skip_to(tp, exc.last_offset + 1)

    def _process(self, batch: dict[TopicPartition, list[Any]]) -> None:
        try:
            self._commit(batch)
            self._backoff = self.config.retry_backoff_s
            return
        except Exception as exc:
            if self.classifier.batch_failed(exc) is Verdict.RECONNECT:
                self._db_down(exc)
                return
            # a write race (two processes storing one new span) or one bad record
            self.sensor.retried()
            log.warning("batch failed (%s: %s); retrying one record per transaction", type(exc).__name__, exc)
        for tp, records in batch.items():
            for record in records:
                mismatched = self._commit_alone(tp, record)
                if mismatched is None:
                    return  # the database is down: everything is read again from the stored offsets
                if mismatched:
                    break  # re-seeked: the rest of this partition's records will be fetched again

    def _commit_alone(self, tp: TopicPartition, record: Any) -> set[TopicPartition] | None:
        """Apply one record in its own transaction, dead-lettering it if the classifier says so;
        returns the partitions re-seeked, or None when the database is down."""
        attempt = 0
        while True:
            attempt += 1
            try:
                return self._commit({tp: [record]})
            except Exception as exc:
                verdict = self.classifier.record_failed(exc, attempt)
                if verdict is Verdict.RECONNECT:
                    self._db_down(exc)
                    return None
                if verdict is Verdict.DEAD_LETTER:
                    error = exc
                    break
        log.error("record %s/%s@%s fails on its own; dead-lettered (%s)", tp.topic, tp.partition, record.offset,
                  error)
        try:
            return self._commit({tp: [record]}, poison=(self.classifier.reason(error),
                                                        f"{type(error).__name__}: {error}"))
        except Exception as exc:
            self._db_down(exc)
            return None

    def _commit(self, batch: dict[TopicPartition, list[Any]], *,
                poison: tuple[str, str] | None = None) -> set[TopicPartition]:
        """Apply ``batch`` and advance the offsets in one transaction; returns partitions re-seeked."""
        assert self.store is not None
        t0 = time.perf_counter()
        self.sensor.batch_started()
        result = ApplyResult()
        with self.store.transaction() as conn:
            claim = self.committer.claim(conn, batch)
            decoded = decode_records(claim.todo, max_event_bytes=self.config.max_event_bytes, poison=poison)
            if decoded.events:
                result = apply_events(conn, decoded.events, cache=self.store.cache, strict=False)
                decoded.reject(result)
            if decoded.letters:
                write_dead_letters(conn, decoded.letters)
            fault_point("ingest.after_apply")
            self.committer.advance(conn, claim)
        # committed
        self.store.cache.merge(result.new_states)
        self.committer.committed(claim)
        self.sensor.batch_done(result, decoded.letters, time.perf_counter() - t0, advanced=bool(claim.todo))
        log_dead_letters(decoded.letters)
        if decoded.letters and self.dlq is not None:
            self.dlq.publish(decoded.letters)
        return set(claim.mismatched)


__all__ = ["IngestConfig", "IngestService", "IngestStats"]
