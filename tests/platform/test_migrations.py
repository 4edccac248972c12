"""Alembic migrations on a populated PostgreSQL database."""

from __future__ import annotations

import numpy as np
import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from sapwood.platform import runs
from sapwood.platform import schema as t
from sapwood.platform.events import ModelCall
from sapwood.platform.projection import projection_hash
from sapwood.platform.span_encoding import ENC_RAW
from sapwood.platform.storage.spans import insert_span_rows, new_span_rows
from sapwood.platform.store import Store
from sapwood.platform.tokens import digest_bytes
from tests.support.histories import small_execution

pytestmark = pytest.mark.postgres

HEAD = "0011"
#: columns added after 0001 to tables it has (0011: the drift check of each call)
LATER_COLUMNS = {"calls": {"drift_checked", "drift_at"}}
_OLD = sa.MetaData()
#: the projections revision 0001 already has (0007 added the cells, decisions and switch phases), with its columns
OLD_PROJECTIONS = [
    sa.Table(tb.name, _OLD, *[c._copy() for c in tb.columns if c.name not in LATER_COLUMNS.get(tb.name, set())])
    for tb in t.PROJECTION_TABLES if tb.name not in {"cells", "scheduler_decisions", "switch_phases"}
]


def _tables(store: Store) -> set[str]:
    return set(sa.inspect(store.engine).get_table_names()) - {"alembic_version"}


def test_upgrade_downgrade_upgrade_keeps_data(pg_url: str) -> None:
    store = Store.open(pg_url)
    for seed in range(3):
        store.apply(small_execution(seed).events)
    with store.transaction() as conn:
        runs.create_run(conn, "replay-1", runs.ExecutionFilter(status=["success"]))
    live = store.projection_hash()
    with store.transaction() as conn:
        live_0001 = projection_hash(conn, OLD_PROJECTIONS)
    assert store.current_revision() == HEAD

    store.downgrade("0001")
    assert store.current_revision() == "0001"
    assert "runs" not in _tables(store)
    assert "events" in _tables(store)
    assert "cells" not in _tables(store)
    with store.transaction() as conn:
        assert projection_hash(conn, OLD_PROJECTIONS) == live_0001, "the events and projections survive the downgrade"

    store.migrate()
    assert store.current_revision() == HEAD
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


def test_span_encoding_downgrade_widens_spans(pg_url: str) -> None:
    """0004 → 0003 rewrites narrowed token spans as canonical int32 bytes; back up, reads are unchanged."""
    store = Store.open(pg_url)
    writer = small_execution(4)
    store.apply(writer.events)
    calls = [e for e in writer.events if isinstance(e, ModelCall)]
    before = {c.event_id: store.reconstruct_input(c.event_id).copy() for c in calls}
    with store.transaction() as conn:
        encodings = {r[0] for r in conn.execute(sa.text("SELECT DISTINCT encoding FROM spans"))}
    assert encodings - {ENC_RAW}, "token spans are stored narrowed"

    store.downgrade("0003")
    with store.transaction() as conn:
        rows = conn.execute(sa.text("SELECT digest, data FROM spans")).all()
    assert rows, "canonical bytes after downgrade"
    assert all(digest_bytes(bytes(d)) == bytes(k) for k, d in rows), "canonical bytes after downgrade"

    store.migrate()
    for call_id, ids in before.items():
        assert np.array_equal(store.reconstruct_input(call_id), ids)
    store.close()


def _span_storage(store: Store) -> tuple[list[str] | None, int]:
    """The spans table's storage parameters and the number of chunks in its TOAST table."""
    with store.transaction() as conn:
        options, toast = conn.execute(sa.text(
            "SELECT reloptions, reltoastrelid::regclass::text FROM pg_class WHERE relname = 'spans'")).one()
        chunks = conn.execute(sa.text(f"SELECT count(*) FROM {toast}")).scalar_one()
    return options, int(chunks)


def test_spans_up_to_a_page_stay_inline(pg_url: str) -> None:
    """0006 keeps span rows up to 8160 bytes in the table (no TOAST chunks); 0005 moves them out again."""
    store = Store.open(pg_url)
    writer = small_execution(5, obs_min=2500, obs_max=3500)  # observations of 5–7 KB stored as uint16
    store.apply(writer.events)
    options, chunks = _span_storage(store)
    assert options == ["toast_tuple_target=8160"]
    assert chunks == 0

    store.downgrade("0005")
    assert _span_storage(store)[0] is None
    # spans written directly: apply() writes the columns of the head revision
    arrays = [np.ascontiguousarray(arr) for e in small_execution(6, obs_min=2500, obs_max=3500).events
              for arr in e.array_fields().values() if arr.size]
    with store.transaction() as conn:
        insert_span_rows(conn, new_span_rows(conn, {digest_bytes(a.data): a for a in arrays}))
    assert _span_storage(store)[1] > 0, "rows over ~2 KB go to TOAST at the default threshold"
    store.migrate()
    assert _span_storage(store)[0] == ["toast_tuple_target=8160"]
    store.close()
