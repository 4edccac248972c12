"""The ``idempotency_keys`` table: the stored answer of each POST sent with an ``Idempotency-Key``.

Portable SQL on both backends. Its primary key ``(principal, idempotency_key)`` is what makes
concurrent retries safe: of two transactions that both found no row, the second insert fails
with a unique violation (and its whole transaction, the work included, rolls back).
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from sapwood.platform import schema as t

_i = t.idempotency_keys.c


@dataclass(frozen=True)
class StoredAnswer:
    """A row of ``idempotency_keys``: the request it answered (route, digest) and the answer."""

    principal: str
    idempotency_key: str
    route: str
    request_digest: bytes
    status: int
    body: bytes
    created_at: float


def get_answer(conn: Connection, principal: str, key: str) -> StoredAnswer | None:
    """The answer stored for ``key`` sent by ``principal``, None if there is none."""
    row = conn.execute(sa.select(t.idempotency_keys).where(_i.principal == principal, _i.idempotency_key == key)
                       ).mappings().first()
    return None if row is None else StoredAnswer(**{k: row[k] for k in StoredAnswer.__dataclass_fields__})


def insert_answer(conn: Connection, answer: StoredAnswer) -> None:
    """Store ``answer``; a unique violation if the same principal already stored one for the key."""
    conn.execute(t.idempotency_keys.insert().values(**answer.__dict__))
