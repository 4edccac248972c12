"""The Kafka source: the ingest's consumer — group membership, rebalance callbacks, polling, seeking.

The only module that talks to kafka-python's consumer (with :mod:`kafka_bounds`, which bounds its record
batch decompression). Two things here reach past kafka-python's public API into its private group
coordinator (``consumer._coordinator``), both guarded so a kafka-python without it just skips them:
:meth:`KafkaSource.settle_group` (a kafka-python 3.0 join-loop work-around) and
:meth:`KafkaSource.rebalance_pending` (stop topping a batch up while the group wants to rebalance).
"""

from __future__ import annotations

import contextlib
import logging
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from sapwood.ingest import kafka_bounds
from sapwood.ingest.config import IngestConfig
from sapwood.ingest.membership import AUTO, DYNAMIC

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka import ConsumerRebalanceListener, KafkaConsumer, TopicPartition
    from kafka.structs import OffsetAndMetadata

log = logging.getLogger(__name__)

#: A rebalance callback: the partitions assigned, or revoked/lost.
PartitionsCallback = Callable[[list[TopicPartition]], None]

#: kafka-python 3.0 reports its own teardown races as ERROR, some with a traceback (a read on a transport its
#: other thread just closed; a heartbeat request cancelled by the close): its loggers are quieted while
#: :meth:`KafkaSource.close` runs, and only then (Sapwood's own close warnings still show).
_TEARDOWN_LOGGERS = ("kafka",)


@contextlib.contextmanager
def quiet_socket_teardown() -> Iterator[None]:
    loggers = [logging.getLogger(name) for name in _TEARDOWN_LOGGERS]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


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
        # a partition set missed by the first assignment is noticed within this delay (see settle_group)
        "metadata_max_age_ms": 30_000,
        "reconnect_backoff_max_ms": 1000,  # back within a second of a broker restart
    }
    settings.update(cfg.consumer_config)
    return settings


class _Listener(ConsumerRebalanceListener):
    def __init__(self, topic: str, assigned: PartitionsCallback, revoked: PartitionsCallback) -> None:
        self.topic, self.assigned, self.revoked = topic, assigned, revoked

    # An exception escaping a listener makes kafka-python log a traceback at ERROR (on close too):
    # each callback logs its own failure as a warning instead.
    def on_partitions_revoked(self, revoked: Iterable[TopicPartition]) -> None:
        self._guard(self.revoked, revoked)

    def on_partitions_lost(self, lost: Iterable[TopicPartition]) -> None:
        self._guard(self.revoked, lost)

    def on_partitions_assigned(self, assigned: Iterable[TopicPartition]) -> None:
        self._guard(self.assigned, [tp for tp in assigned if tp.topic == self.topic])

    @staticmethod
    def _guard(fn: PartitionsCallback, tps: Iterable[TopicPartition]) -> None:
        try:
            fn(list(tps))
        except Exception as exc:
            name = getattr(fn, "__name__", repr(fn))
            log.warning("rebalance callback %s failed: %s: %s", name, type(exc).__name__, exc)


class KafkaSource:
    """The consumer of one ingest process; rebalances call ``on_assigned`` (partitions of ``cfg.topic``)
    and ``on_revoked`` from inside :meth:`poll_batch` / :meth:`settle_group`, on the polling thread."""

    def __init__(self, cfg: IngestConfig, client_id: str, *, on_assigned: PartitionsCallback,
                 on_revoked: PartitionsCallback) -> None:
        self.cfg = cfg
        self.client_id = client_id
        self._on_assigned, self._on_revoked = on_assigned, on_revoked
        self.consumer: Any = None

    def open(self, instance_id: str | None) -> None:
        """Join the group (``instance_id``: static membership, None: dynamic) and subscribe."""
        cfg = self.cfg
        # record batches are inflated by poll()'s caller: bound them in this thread (the one that polls)
        kafka_bounds.install(cfg.max_batch_bytes or max(64 << 20, 4 * cfg.max_event_bytes), cfg.max_event_bytes)
        self.consumer = KafkaConsumer(**consumer_settings(cfg, self.client_id, instance_id))
        self.consumer.subscribe([cfg.topic], listener=_Listener(cfg.topic, self._on_assigned, self._on_revoked))
        # Know the topic's partitions before joining, so the first assignment is not empty. Subscribed
        # first, so this metadata also reaches the group coordinator: kafka-python compares the metadata
        # the leader assigned from with later metadata, and a snapshot taken before any metadata
        # (subscribing afterwards) makes every fresh start rebalance once more right after its first batch.
        deadline = time.monotonic() + 30
        while not self.consumer.partitions_for_topic(cfg.topic) and time.monotonic() < deadline:
            time.sleep(0.2)

    def close(self) -> None:
        """Leave the group (no Kafka commit: the store holds the offsets); safe to call twice."""
        if self.consumer is None:
            return
        with quiet_socket_teardown():
            try:
                self.consumer.close(autocommit=False)
            except Exception as exc:
                log.warning("consumer close failed: %s", exc)
        self.consumer = None

    # -- the group ----------------------------------------------------------------------------------
    def _coordinator_method(self, name: str) -> Any:
        # kafka-python's private group coordinator: no public API tells a pending rejoin or drives one.
        return getattr(getattr(self.consumer, "_coordinator", None), name, None)

    def settle_group(self, stopping: Callable[[], bool]) -> None:
        """Finish a pending rebalance before polling for records.

        Works around kafka-python 3.0: when ``poll()``'s timeout expires while JoinGroup/SyncGroup
        is in flight and the join completes before the next ``poll()``, its result is dropped
        and a new join starts; on a busy machine the group leader can loop like that for ever.
        Driving the join with a long timeout while a rejoin is needed avoids the window.
        """
        need_rejoin = self._coordinator_method("need_rejoin")
        ensure_active = self._coordinator_method("ensure_active_group")
        if need_rejoin is None or ensure_active is None:
            return
        deadline = time.monotonic() + 60
        while not stopping() and time.monotonic() < deadline and need_rejoin():
            try:
                ensure_active(timeout_ms=5000)
            except Exception as exc:
                log.warning("rejoining the group failed: %s", exc)
                return

    def rebalance_pending(self) -> bool:
        need_rejoin = self._coordinator_method("need_rejoin")
        return bool(need_rejoin()) if need_rejoin is not None else False

    # -- records ------------------------------------------------------------------------------------
    def poll_batch(self) -> dict[TopicPartition, list[Any]]:
        """Records of one transaction: a poll, topped up for ``batch_wait_ms`` while under ``batch_size``.

        Raises :class:`kafka_bounds.UndecodableBatchError` for a record batch it cannot read (one that inflates
        past the bound is its subclass :class:`kafka_bounds.BatchTooLargeError`)."""
        cfg = self.cfg
        polled = {tp: list(recs) for tp, recs in
                  self.consumer.poll(timeout_ms=cfg.poll_timeout_ms, max_records=cfg.batch_size).items()}
        n = sum(len(r) for r in polled.values())
        deadline = time.monotonic() + cfg.batch_wait_ms / 1000
        while 0 < n < cfg.batch_size and not self.rebalance_pending():
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

    def assignment(self) -> set[TopicPartition]:
        return set(self.consumer.assignment())

    def seek(self, tp: TopicPartition, offset: int | None) -> None:
        """Read ``tp`` from ``offset`` next (None: from the beginning)."""
        if offset is None:
            self.consumer.seek_to_beginning(tp)
        else:
            self.consumer.seek(tp, offset)

    def pause(self, tps: Iterable[TopicPartition]) -> None:
        """Stop fetching ``tps`` (those still assigned) until :meth:`resume`."""
        assigned = self.assignment()
        live = [tp for tp in tps if tp in assigned]
        if live:
            self.consumer.pause(*live)

    def resume(self, tps: Iterable[TopicPartition]) -> None:
        live = list(tps)
        if live:
            self.consumer.resume(*live)

    # -- offsets ------------------------------------------------------------------------------------
    def commit_copy(self, offsets: Mapping[TopicPartition, int]) -> None:
        """Best-effort copy of next offsets to Kafka (for lag tooling; the store is the truth)."""
        try:
            self.consumer.commit_async({tp: OffsetAndMetadata(o, "", -1) for tp, o in offsets.items()})
        except Exception as exc:
            log.debug("kafka offset commit skipped: %s", exc)

    def end_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        """Log-end offsets of ``tps`` (asks the broker; at most 2 s)."""
        return dict(self.consumer.end_offsets(tps, timeout_ms=2000))


__all__ = ["KafkaSource", "TopicPartition", "consumer_settings", "quiet_socket_teardown"]
