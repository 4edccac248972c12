"""The offset store: where ingest resumes, per (consumer group, topic, partition), advanced by compare-and-set.

``consumer_offsets(group_id, topic, partition) → next_offset`` is written in the same transaction as the
events it covers, so it is the source of truth; Kafka's own committed offsets are only a copy for tooling.

A writer :meth:`~OffsetStore.lock` s the partitions of its batch (read, and on PostgreSQL hold the rows
until the transaction ends), compares them with the positions it reads from, and
:meth:`~OffsetStore.advance` s them giving the values it read as ``expected``: a partition whose stored
offset moved meanwhile is refused with :class:`StaleOffsetError` (the transaction must roll back), and a
partition first stored by two writers at once fails on the primary key (:class:`~sapwood.platform.errors.ConflictError`
through ``translate_errors``). Implementations: :mod:`.sqlite.offsets` (portable SQL), :mod:`.postgres.offsets`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from sapwood.platform import schema as t
from sapwood.platform.errors import ConflictError


class StaleOffsetError(ConflictError):
    """A compare-and-set found a stored offset other than the expected one (another writer advanced it)."""

    reason = "stale_offset"

    def __init__(self, group: str, topic: str, stale: Mapping[int, int]) -> None:
        super().__init__(f"group {group!r}, topic {topic!r}: stored offsets moved since they were read "
                         f"(partition → expected: {dict(sorted(stale.items()))}); re-read them and re-seek")
        self.stale = dict(stale)


class OffsetStore(Protocol):
    """Per-partition next offsets of a consumer group, read and written in the caller's transaction."""

    def read(self, conn: Connection, group: str, topic: str,
             partitions: Iterable[int] | None = None) -> dict[int, int]:
        """Stored next offsets by partition (``partitions``: only these; partitions never stored are absent)."""
        ...

    def lock(self, conn: Connection, group: str, topic: str,
             partitions: Iterable[int] | None = None) -> dict[int, int]:
        """Like :meth:`read`, and hold the rows until the transaction ends where the database can."""
        ...

    def advance(self, conn: Connection, group: str, topic: str, offsets: Mapping[int, int], *,
                expected: Mapping[int, int]) -> None:
        """Store ``offsets`` (partition → next offset): a partition in ``expected`` is updated only if it
        still holds that offset (else :class:`StaleOffsetError`, nothing written), the others are inserted."""
        ...


def all_offsets(conn: Connection) -> list[dict[str, Any]]:
    """``{group_id, topic, partition, next_offset}`` of every committed consumer offset, ordered."""
    c = t.consumer_offsets.c
    rows = conn.execute(sa.select(c.group_id, c.topic, c.partition, c.next_offset)
                        .order_by(c.group_id, c.topic, c.partition)).mappings()
    return [dict(r) for r in rows]


__all__ = ["OffsetStore", "StaleOffsetError", "all_offsets"]
