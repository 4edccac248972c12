"""Store-wide reads for statistics: unique (content-addressed) tokens."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from sapwood.platform import schema as t


def unique_tokens(conn: Connection) -> int:
    """Tokens of the distinct spans the tree's nodes use (each stored once however many nodes share it)."""
    distinct = sa.select(t.nodes.c.span_digest, t.nodes.c.length).distinct().subquery()
    return int(conn.execute(sa.select(sa.func.coalesce(sa.func.sum(distinct.c.length), 0))).scalar_one())
