"""The offset store on SQLite, in portable SQL (the PostgreSQL store extends it).

SQLite has no row locks: :meth:`lock` is a plain read, and the compare-and-set rests on the conditional
``UPDATE ... WHERE next_offset = :expected`` (one statement per partition; in-process, so cheap). A second
writer that read the same offset updates no row and is refused.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from sapwood.platform import schema as t
from sapwood.platform.storage.offsets import OffsetStore, StaleOffsetError

_c = t.consumer_offsets.c


class SqliteOffsetStore(OffsetStore):
    """:class:`~sapwood.platform.storage.offsets.OffsetStore` in portable SQL."""

    def _select(self, group: str, topic: str, partitions: Iterable[int] | None) -> sa.Select[Any]:
        q = sa.select(_c.partition, _c.next_offset).where(_c.group_id == group, _c.topic == topic)
        if partitions is not None:
            q = q.where(_c.partition.in_(sorted(set(partitions))))
        return q

    def read(self, conn: Connection, group: str, topic: str,
             partitions: Iterable[int] | None = None) -> dict[int, int]:
        return offsets_by_partition(conn, self._select(group, topic, partitions))

    def lock(self, conn: Connection, group: str, topic: str,
             partitions: Iterable[int] | None = None) -> dict[int, int]:
        return self.read(conn, group, topic, partitions)

    def advance(self, conn: Connection, group: str, topic: str, offsets: Mapping[int, int], *,
                expected: Mapping[int, int]) -> None:
        _check(offsets)
        now = time.time()
        updates = {p: o for p, o in offsets.items() if p in expected}
        if updates:
            moved = self._update(conn, group, topic, {p: (expected[p], o) for p, o in updates.items()}, now)
            if moved:
                raise StaleOffsetError(group, topic, {p: expected[p] for p in moved})
        inserts = [{"group_id": group, "topic": topic, "partition": p, "next_offset": o, "updated_at": now}
                   for p, o in offsets.items() if p not in expected]
        if inserts:
            conn.execute(t.consumer_offsets.insert(), inserts)

    def _update(self, conn: Connection, group: str, topic: str, changes: Mapping[int, tuple[int, int]],
                now: float) -> set[int]:
        """Apply ``partition → (expected, new)``; returns the partitions whose stored offset was not expected."""
        moved: set[int] = set()
        for p, (old, new) in changes.items():
            stmt = (t.consumer_offsets.update()
                    .where(_c.group_id == group, _c.topic == topic, _c.partition == p, _c.next_offset == old)
                    .values(next_offset=new, updated_at=now))
            if conn.execute(stmt).rowcount != 1:
                moved.add(p)
        return moved


def offsets_by_partition(conn: Connection, query: sa.Select[Any]) -> dict[int, int]:
    return {int(row[0]): int(row[1]) for row in conn.execute(query)}


def _check(offsets: Mapping[int, int]) -> None:
    bad = {p: o for p, o in offsets.items() if not (isinstance(o, int) and o >= 0)}
    if bad:
        raise ValueError(f"next offsets must be integers ≥ 0, got {bad}")


__all__ = ["SqliteOffsetStore", "offsets_by_partition"]
