"""API keys on PostgreSQL: a revocation reads the active keys ``FOR UPDATE``."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from sapwood.platform.storage.api_keys import SqlApiKeyStore


class PostgresApiKeyStore(SqlApiKeyStore):
    """:class:`~sapwood.platform.storage.api_keys.ApiKeyStore` for PostgreSQL."""

    def lock(self, q: sa.Select[Any]) -> sa.Select[Any]:
        return q.with_for_update()
