"""The API key table: issued keys (SHA-256 of the secret, never the secret), their scopes and revocation.

:class:`ApiKeyStore` is what the API's key management and verifier need; :func:`api_key_store` picks
the backend's implementation. They differ only in how a revocation reads the active keys: PostgreSQL
locks them (``FOR UPDATE``) so two admins revoking each other cannot both succeed; SQLite needs no
row lock because the API's write transaction holds the database's write lock from its start.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from sapwood.platform import schema as t

_k = t.api_keys.c


class ApiKeyStore(Protocol):
    """Rows of ``api_keys`` as dicts: ``key_id name secret_hash scopes created_at revoked``."""

    def insert(self, conn: Connection, row: dict[str, Any]) -> None:
        """Store a new key's row."""
        ...

    def get(self, conn: Connection, key_id: str) -> dict[str, Any] | None:
        """The key's row, None if there is no such key."""
        ...

    def all(self, conn: Connection) -> list[dict[str, Any]]:
        """Every key's row, oldest first (ties by ``key_id``)."""
        ...

    def active_for_update(self, conn: Connection) -> list[tuple[str, str]]:
        """``(key_id, scopes)`` of the keys not revoked, locked against concurrent revocations until commit."""
        ...

    def revoke(self, conn: Connection, key_id: str) -> None:
        """Mark ``key_id`` revoked."""
        ...


class SqlApiKeyStore(ApiKeyStore):
    """:class:`ApiKeyStore` in portable SQL; a subclass supplies :meth:`lock` (the backend's row lock)."""

    @abstractmethod
    def lock(self, q: sa.Select[Any]) -> sa.Select[Any]:
        """``q`` with the backend's row lock (PostgreSQL ``FOR UPDATE``; SQLite relies on ``BEGIN IMMEDIATE``)."""

    def insert(self, conn: Connection, row: dict[str, Any]) -> None:
        conn.execute(t.api_keys.insert().values(**row))

    def get(self, conn: Connection, key_id: str) -> dict[str, Any] | None:
        row = conn.execute(sa.select(t.api_keys).where(_k.key_id == key_id)).mappings().first()
        return None if row is None else dict(row)

    def all(self, conn: Connection) -> list[dict[str, Any]]:
        return [dict(r) for r in conn.execute(sa.select(t.api_keys).order_by(_k.created_at, _k.key_id)).mappings()]

    def active_for_update(self, conn: Connection) -> list[tuple[str, str]]:
        q = self.lock(sa.select(_k.key_id, _k.scopes).where(_k.revoked == sa.false()))
        return [(r.key_id, r.scopes) for r in conn.execute(q)]

    def revoke(self, conn: Connection, key_id: str) -> None:
        conn.execute(t.api_keys.update().where(_k.key_id == key_id).values(revoked=True))
