"""The offset store on PostgreSQL: rows locked ``FOR UPDATE`` for the transaction, and every partition's
compare-and-set in one ``UPDATE ... FROM (VALUES ...) ... RETURNING`` statement."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from sapwood.platform import schema as t
from sapwood.platform.storage.sqlite.offsets import SqliteOffsetStore, offsets_by_partition

_c = t.consumer_offsets.c


class PostgresOffsetStore(SqliteOffsetStore):
    """:class:`~sapwood.platform.storage.offsets.OffsetStore` with row locks: two ingest processes cannot
    both advance one partition from the same offset (the second waits, then sees the moved offset)."""

    def lock(self, conn: Connection, group: str, topic: str,
             partitions: Iterable[int] | None = None) -> dict[int, int]:
        return offsets_by_partition(conn, self._select(group, topic, partitions).with_for_update())

    def _update(self, conn: Connection, group: str, topic: str, changes: Mapping[int, tuple[int, int]],
                now: float) -> set[int]:
        v = sa.values(sa.column("p", sa.Integer), sa.column("old", sa.BigInteger), sa.column("new", sa.BigInteger),
                      name="cas").data([(p, old, new) for p, (old, new) in changes.items()])
        stmt = (t.consumer_offsets.update()
                .where(_c.group_id == group, _c.topic == topic, _c.partition == v.c.p, _c.next_offset == v.c.old)
                .values(next_offset=v.c.new, updated_at=now)
                .returning(_c.partition))
        done = {int(p) for (p,) in conn.execute(stmt)}
        return set(changes) - done


__all__ = ["PostgresOffsetStore"]
