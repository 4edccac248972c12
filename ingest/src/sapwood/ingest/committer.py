"""The offset committer: which partitions this process holds, where it reads each from, and advancing the
stored offsets by compare-and-set in the batch's own transaction.

Per batch (inside the caller's transaction): :meth:`OffsetCommitter.claim` locks the stored offsets of the
batch's partitions and keeps, per partition, only the records at or past this process's position, and only
where the stored offset equals that position (a zombie, or a process that lost its partitions in a
rebalance, cannot apply the same records twice); :meth:`~OffsetCommitter.advance` stores each partition's
next offset through the platform's :class:`~sapwood.platform.storage.offsets.OffsetStore`. After the
commit, :meth:`~OffsetCommitter.committed` moves the positions, re-seeks the mismatched partitions to their
stored offsets and copies the offsets to Kafka (best effort).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.engine import Connection

from sapwood.ingest.source import KafkaSource, TopicPartition
from sapwood.platform.storage.backends import offset_store
from sapwood.platform.storage.offsets import OffsetStore
from sapwood.platform.store import Store

log = logging.getLogger(__name__)

NOT_ASSIGNED: Any = object()
"""What :meth:`OffsetCommitter.position` returns for a partition this process does not hold."""


@dataclass
class Claim:
    """One transaction's hold on its partitions."""

    stored: dict[int, int]
    """Partition → stored next offset, as locked (absent: nothing stored yet)."""
    todo: dict[TopicPartition, list[Any]] = field(default_factory=dict)
    """The records to apply, per partition whose stored offset matched this process's position."""
    mismatched: dict[TopicPartition, int | None] = field(default_factory=dict)
    """Partitions whose stored offset moved (→ that offset): re-seeked after the transaction."""

    @property
    def new_offsets(self) -> dict[TopicPartition, int]:
        return {tp: records[-1].offset + 1 for tp, records in self.todo.items()}


class OffsetCommitter:
    """Positions of the partitions held, kept in step with the store and the consumer; thread-safe."""

    def __init__(self, group: str, topic: str, source: KafkaSource, *, commit_to_kafka: bool = True) -> None:
        self.group, self.topic, self.source, self.commit_to_kafka = group, topic, source, commit_to_kafka
        #: Partition → stored next offset this process reads from (None: nothing stored yet).
        self.positions: dict[TopicPartition, int | None] = {}
        self.unsynced: set[TopicPartition] = set()
        """Held partitions not yet seeked to their stored offsets (paused until they are)."""
        self.lock = threading.RLock()
        self.offsets: OffsetStore | None = None

    def bind(self, store: Store) -> None:
        """Use ``store``'s offset store (by its dialect)."""
        self.offsets = offset_store(store.engine)

    def _store(self) -> OffsetStore:
        if self.offsets is None:
            raise RuntimeError("OffsetCommitter.bind(store) must be called before offsets are read or stored")
        return self.offsets

    # -- partitions held ----------------------------------------------------------------------------
    def held(self) -> dict[int, int | None]:
        """Partition number → position, for the partitions of the topic held now."""
        with self.lock:
            return {tp.partition: o for tp, o in self.positions.items() if tp.topic == self.topic}

    def snapshot(self) -> dict[TopicPartition, int | None]:
        with self.lock:
            return dict(self.positions)

    def position(self, tp: TopicPartition) -> Any:
        """The next offset this process reads ``tp`` from: an int, None (nothing stored) or ``NOT_ASSIGNED``."""
        with self.lock:
            return self.positions.get(tp, NOT_ASSIGNED)

    def assign(self, tps: Iterable[TopicPartition]) -> None:
        with self.lock:
            for tp in tps:
                self.positions[tp] = None
                self.unsynced.add(tp)

    def revoke(self, tps: Iterable[TopicPartition]) -> None:
        with self.lock:
            for tp in tps:
                self.positions.pop(tp, None)
                self.unsynced.discard(tp)

    def unsync_all(self) -> list[TopicPartition]:
        """Mark every held partition as needing a re-read of its stored offset; returns them."""
        with self.lock:
            tps = list(self.positions)
            self.unsynced.update(tps)
        return tps

    def pending(self) -> list[TopicPartition]:
        with self.lock:
            return [tp for tp in self.unsynced if tp in self.positions]

    def readable(self, polled: Mapping[TopicPartition, Sequence[Any]]) -> dict[TopicPartition, list[Any]]:
        """The polled records of partitions held and synced (others may be stale: dropped, read again)."""
        with self.lock:
            return {tp: list(recs) for tp, recs in polled.items()
                    if recs and tp in self.positions and tp not in self.unsynced}

    def sync(self, store: Store, tps: Sequence[TopicPartition]) -> None:
        """Seek ``tps`` to their stored offsets (the beginning when nothing is stored) and resume them."""
        if not tps:
            return
        with store.transaction() as conn:
            stored = self._store().read(conn, self.group, self.topic, [tp.partition for tp in tps])
        assigned = self.source.assignment()
        with self.lock:
            live = [tp for tp in tps if tp in self.positions and tp in assigned]
            for tp in live:
                offset = stored.get(tp.partition)
                self.source.seek(tp, offset)
                self.positions[tp] = offset
                self.unsynced.discard(tp)
            self.source.resume(live)

    # -- one transaction ----------------------------------------------------------------------------
    def claim(self, conn: Connection, batch: Mapping[TopicPartition, Sequence[Any]]) -> Claim:
        """Lock the batch's stored offsets and keep the records this process may apply."""
        claim = Claim(self._store().lock(conn, self.group, self.topic, [tp.partition for tp in batch]))
        for tp, records in batch.items():
            expected = self.position(tp)
            if expected is NOT_ASSIGNED:
                continue
            have = claim.stored.get(tp.partition)
            if have != expected:
                claim.mismatched[tp] = have
                continue
            todo = [r for r in records if expected is None or r.offset >= expected]
            if todo:
                claim.todo[tp] = todo
        return claim

    def advance(self, conn: Connection, claim: Claim) -> None:
        """Store the claim's next offsets (compare-and-set against the offsets it locked)."""
        new = {tp.partition: o for tp, o in claim.new_offsets.items()}
        if new:
            self._store().advance(conn, self.group, self.topic, new, expected=claim.stored)

    def committed(self, claim: Claim) -> None:
        """After the commit: move the positions, re-seek mismatched partitions, copy the offsets to Kafka."""
        new = claim.new_offsets
        with self.lock:
            for tp, offset in new.items():
                if tp in self.positions:
                    self.positions[tp] = offset
        for tp, have in claim.mismatched.items():
            self.reseek(tp, have)
        if self.commit_to_kafka and new:
            self.source.commit_copy(new)

    def reseek(self, tp: TopicPartition, offset: int | None) -> None:
        log.warning("partition %s: stored offset %s differs from this process's position %s; re-seeking",
                    tp.partition, offset, self.positions.get(tp))
        with self.lock:
            if tp not in self.positions:
                return
            self.positions[tp] = offset
            self.source.seek(tp, offset)

    def skip_to(self, tp: TopicPartition, offset: int) -> None:
        """Read ``tp`` from ``offset`` next (after its stored offset moved past records never read)."""
        with self.lock:
            if tp in self.positions:
                self.source.seek(tp, offset)


__all__ = ["NOT_ASSIGNED", "Claim", "OffsetCommitter"]
