"""API key store contract on SQLite and PostgreSQL; on PostgreSQL a revocation's read locks the active keys."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from sapwood.platform.storage.backends import api_key_store
from sapwood.platform.store import Store


def _row(key_id: str, scopes: str, created_at: float) -> dict[str, object]:
    return {"key_id": key_id, "name": f"key {key_id}", "secret_hash": bytes(32), "scopes": scopes,
            "created_at": created_at, "revoked": False}


def test_keys_are_stored_listed_and_revoked(store: Store) -> None:
    keys = api_key_store(store.engine)
    with store.transaction() as conn:
        keys.insert(conn, _row("b" * 16, "read", 2.0))
        keys.insert(conn, _row("c" * 16, "admin", 1.0))
        keys.insert(conn, _row("a" * 16, "read write", 2.0))
        assert [r["key_id"] for r in keys.all(conn)] == ["c" * 16, "a" * 16, "b" * 16], "by time, then id"
        got = keys.get(conn, "a" * 16)
        assert got is not None
        assert got["scopes"] == "read write"
        assert bytes(got["secret_hash"]) == bytes(32)
        assert keys.get(conn, "d" * 16) is None
        keys.revoke(conn, "b" * 16)
        assert sorted(keys.active_for_update(conn)) == [("a" * 16, "read write"), ("c" * 16, "admin")]
        revoked = keys.get(conn, "b" * 16)
        assert revoked is not None
        assert bool(revoked["revoked"]) is True


@pytest.mark.postgres
def test_postgres_revocations_wait_for_each_other(pg_url: str) -> None:
    store = Store.open(pg_url)
    try:
        keys = api_key_store(store.engine)
        with store.transaction() as conn:
            keys.insert(conn, _row("a" * 16, "admin", 1.0))
            keys.insert(conn, _row("b" * 16, "admin", 2.0))
        with store.engine.connect() as first, store.engine.connect() as second:
            t1, t2 = first.begin(), second.begin()
            assert len(keys.active_for_update(first)) == 2
            second.exec_driver_sql("SET LOCAL lock_timeout = '200ms'")
            with pytest.raises(sa.exc.OperationalError, match="lock timeout"):
                keys.active_for_update(second)
            t2.rollback()
            t1.rollback()
    finally:
        store.close()


def test_unknown_dialect_is_refused() -> None:
    with pytest.raises(ValueError, match="no API key store for dialect 'mysql'"):
        api_key_store("mysql")
