"""Transaction modes: PostgreSQL snapshot reads see one state; SQLite write transactions lock before reading."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

from sapwood.platform.storage.backends import transactions
from sapwood.platform.store import Store

_COUNT = sa.text("SELECT count(*) FROM api_keys")
_INSERT = sa.text("INSERT INTO api_keys (key_id, name, secret_hash, scopes, created_at, revoked) "
                  "VALUES (:k, 'n', :h, 'read', 0, false)")


@pytest.mark.postgres
def test_postgres_snapshot_reads_do_not_see_later_commits(pg_url: str) -> None:
    store = Store.open(pg_url)
    try:
        modes = transactions(store.engine)
        with store.engine.connect() as raw:
            conn = modes.snapshot(raw)
            assert conn.execute(_COUNT).scalar_one() == 0
            with store.engine.begin() as other:
                other.execute(_INSERT, {"k": "a" * 16, "h": bytes(32)})
            assert conn.execute(_COUNT).scalar_one() == 0, "the commit came after the snapshot"
            conn.commit()
            assert conn.execute(_COUNT).scalar_one() == 1
    finally:
        store.close()


def test_sqlite_write_transactions_take_the_lock_before_their_first_read(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    Store.open(url).close()
    impatient = sa.create_engine(url, connect_args={"timeout": 0.05})
    modes = transactions(impatient)
    try:
        with impatient.begin() as first:
            modes.begin_write(first)
            first.execute(_COUNT)
            with pytest.raises(sa.exc.OperationalError, match="database is locked"), impatient.begin() as second:
                modes.begin_write(second)
    finally:
        impatient.dispose()


def test_unknown_dialect_is_refused() -> None:
    with pytest.raises(ValueError, match="no transaction modes for dialect 'mysql'"):
        transactions("mysql")
