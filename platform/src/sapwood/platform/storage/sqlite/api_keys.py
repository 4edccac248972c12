"""API keys on SQLite: no row locks (the API's write transaction starts with ``BEGIN IMMEDIATE``)."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from sapwood.platform.storage.api_keys import SqlApiKeyStore


class SQLiteApiKeyStore(SqlApiKeyStore):
    """:class:`~sapwood.platform.storage.api_keys.ApiKeyStore` for SQLite."""

    def lock(self, q: sa.Select[Any]) -> sa.Select[Any]:
        return q  # the database's write lock, taken when the transaction began, serializes revocations
