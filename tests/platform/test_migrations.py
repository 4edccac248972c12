"""Alembic migrations on a populated PostgreSQL database."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from sapwood.platform import runs
from sapwood.platform import schema as t
from sapwood.platform.store import Store
from support.histories import small_execution

pytestmark = pytest.mark.postgres


def _tables(store: Store) -> set[str]:
    return set(sa.inspect(store.engine).get_table_names()) - {"alembic_version"}


def test_upgrade_downgrade_upgrade_keeps_data(pg_url: str) -> None:
    store = Store.open(pg_url)
    for seed in range(3):
        store.apply(small_execution(seed).events)
    with store.transaction() as conn:
        runs.create_run(conn, "replay-1", runs.ExecutionFilter(status=["success"]))
    live = store.projection_hash()
    assert store.current_revision() == "0002"

    store.downgrade("0001")
    assert store.current_revision() == "0001"
    assert "runs" not in _tables(store) and "events" in _tables(store)
    assert store.projection_hash() == live, "the event store and projections survive the downgrade"

    store.migrate()
    assert store.current_revision() == "0002"
    assert store.projection_hash() == live
    store.apply(small_execution(9).events)  # still writable after the round trip

    store.downgrade("base")
    assert _tables(store) == set()
    store.migrate()
    assert _tables(store) == {tb.name for tb in t.metadata.sorted_tables}
    store.close()


def test_models_match_migrations(pg_url: str) -> None:
    store = Store.open(pg_url)
    with store.engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), t.metadata)
    store.close()
    assert diff == [], f"schema.py and migrations/ disagree: {diff}"
