"""Consumer offsets kept in the store, in the same transaction as the events they cover.

``consumer_offsets(group_id, topic, partition) → next_offset`` is the source of truth for
where ingest resumes; Kafka's own committed offsets are only a copy for tooling.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from sapwood.platform import schema as t

_c = t.consumer_offsets.c


def load_offsets(conn: Connection, group: str, topic: str, partitions: Iterable[int] | None = None, *,
                 for_update: bool = False) -> dict[int, int]:
    """Stored next offsets by partition (partitions never committed are absent).

    ``for_update`` locks the rows until the transaction ends (PostgreSQL), so two ingest
    processes cannot both advance one partition from the same offset.
    """
    q = sa.select(_c.partition, _c.next_offset).where(_c.group_id == group, _c.topic == topic)
    if partitions is not None:
        q = q.where(_c.partition.in_(sorted(set(partitions))))
    if for_update and conn.dialect.name == "postgresql":
        q = q.with_for_update()
    return {int(p): int(o) for p, o in conn.execute(q)}


def store_offsets(conn: Connection, group: str, topic: str, offsets: dict[int, int], *,
                  existing: Iterable[int]) -> None:
    """Write next offsets: UPDATE the partitions in ``existing``, INSERT the others.

    A concurrent INSERT of the same partition fails on the primary key, which aborts the
    whole transaction: the caller re-reads the offsets and re-seeks.
    """
    known = set(existing)
    now = time.time()
    updates = [{"_p": p, "next_offset": o, "updated_at": now} for p, o in offsets.items() if p in known]
    inserts = [{"group_id": group, "topic": topic, "partition": p, "next_offset": o, "updated_at": now}
               for p, o in offsets.items() if p not in known]
    if updates:
        stmt = (
            t.consumer_offsets.update()
            .where(_c.group_id == group, _c.topic == topic, _c.partition == sa.bindparam("_p"))
            .values(next_offset=sa.bindparam("next_offset"), updated_at=sa.bindparam("updated_at"))
        )
        conn.execute(stmt, updates)
    if inserts:
        conn.execute(t.consumer_offsets.insert(), inserts)


__all__ = ["load_offsets", "store_offsets"]
