"""Store-wide reads for statistics: unique (content-addressed) tokens and the ingest's stored offsets."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from sapwood.platform import schema as t


def unique_tokens(conn: Connection) -> int:
    """Tokens of the distinct spans the tree's nodes use (each stored once however many nodes share it)."""
    distinct = sa.select(t.nodes.c.span_digest, t.nodes.c.length).distinct().subquery()
    return int(conn.execute(sa.select(sa.func.coalesce(sa.func.sum(distinct.c.length), 0))).scalar_one())


def stored_offsets(conn: Connection) -> list[dict[str, Any]]:
    """``{group_id, topic, partition, next_offset}`` of every committed consumer offset, ordered."""
    c = t.consumer_offsets.c
    rows = conn.execute(sa.select(c.group_id, c.topic, c.partition, c.next_offset)
                        .order_by(c.group_id, c.topic, c.partition)).mappings()
    return [dict(r) for r in rows]
