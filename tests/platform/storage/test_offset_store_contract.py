"""The offset store's contract, run against SQLite and PostgreSQL (the ``store`` fixture)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from sapwood.platform import schema as t
from sapwood.platform.errors import ConflictError
from sapwood.platform.storage.backends import offset_store
from sapwood.platform.storage.offsets import OffsetStore, StaleOffsetError
from sapwood.platform.store import Store

G, T = "group-a", "topic-a"


def offsets(store: Store) -> OffsetStore:
    return offset_store(store.engine)


def rows(store: Store) -> set[tuple[str, str, int, int]]:
    c = t.consumer_offsets.c
    with store.engine.connect() as conn:
        return {(g, tp, int(p), int(o)) for g, tp, p, o in
                conn.execute(sa.select(c.group_id, c.topic, c.partition, c.next_offset))}


def test_the_store_matches_the_dialect(store: Store) -> None:
    kind = type(offsets(store)).__name__
    assert kind == {"sqlite": "SqliteOffsetStore", "postgresql": "PostgresOffsetStore"}[store.engine.dialect.name]
    with pytest.raises(ValueError, match="no offset store for dialect 'mysql'"):
        offset_store("mysql")
    assert offset_store(store.engine) is offset_store(store.engine.dialect.name), "one per dialect"


def test_first_commit_inserts_and_is_read_back(store: Store) -> None:
    o = offsets(store)
    with store.transaction() as conn:
        assert o.read(conn, G, T) == {}
        assert o.lock(conn, G, T, [0, 1]) == {}
        o.advance(conn, G, T, {0: 7, 1: 3}, expected={})
    with store.transaction() as conn:
        assert o.read(conn, G, T) == {0: 7, 1: 3}
        assert o.read(conn, G, T, [1]) == {1: 3}
        assert o.lock(conn, G, T, [0]) == {0: 7}
    assert rows(store) == {(G, T, 0, 7), (G, T, 1, 3)}


def test_advance_from_the_expected_offset(store: Store) -> None:
    o = offsets(store)
    with store.transaction() as conn:
        o.advance(conn, G, T, {0: 10}, expected={})
    with store.transaction() as conn:
        stored = o.lock(conn, G, T, [0])
        o.advance(conn, G, T, {0: 25}, expected=stored)
    with store.transaction() as conn:
        assert o.read(conn, G, T) == {0: 25}


def test_a_stale_compare_and_set_is_refused_and_writes_nothing(store: Store) -> None:
    o = offsets(store)
    with store.transaction() as conn:
        o.advance(conn, G, T, {0: 10, 1: 5}, expected={})
    with store.transaction() as conn:  # another writer moved partition 0 to 20
        o.advance(conn, G, T, {0: 20}, expected={0: 10})
    with pytest.raises(StaleOffsetError) as info, store.transaction() as conn:  # a zombie still expects 10
        o.advance(conn, G, T, {0: 15, 1: 9}, expected={0: 10, 1: 5})
    assert info.value.stale == {0: 10}
    assert isinstance(info.value, ConflictError)
    assert "re-seek" in str(info.value)
    assert rows(store) == {(G, T, 0, 20), (G, T, 1, 5)}, "the refused transaction rolled back"


def test_a_second_first_commit_of_one_partition_fails(store: Store) -> None:
    o = offsets(store)
    with store.transaction() as conn:
        o.advance(conn, G, T, {2: 4}, expected={})
    with pytest.raises(ConflictError), store.transaction() as conn:  # it read "nothing stored" too
        o.advance(conn, G, T, {2: 9}, expected={})
    assert rows(store) == {(G, T, 2, 4)}


def test_partitions_groups_and_topics_are_independent(store: Store) -> None:
    o = offsets(store)
    with store.transaction() as conn:
        o.advance(conn, G, T, {0: 1, 1: 2}, expected={})
        o.advance(conn, "group-b", T, {0: 100}, expected={})
        o.advance(conn, G, "topic-b", {0: 200}, expected={})
    with store.transaction() as conn:
        o.advance(conn, G, T, {1: 50}, expected={1: 2})  # partition 0 untouched
    with store.transaction() as conn:
        assert o.read(conn, G, T) == {0: 1, 1: 50}
        assert o.read(conn, "group-b", T) == {0: 100}
        assert o.read(conn, G, "topic-b") == {0: 200}
        assert o.read(conn, "group-c", T) == {}


def test_offset_zero_is_a_stored_offset_not_nothing(store: Store) -> None:
    o = offsets(store)
    with store.transaction() as conn:
        o.advance(conn, G, T, {0: 0}, expected={})
    with store.transaction() as conn:
        stored = o.lock(conn, G, T, [0])
        assert stored == {0: 0}
        assert 0 in stored
        o.advance(conn, G, T, {0: 1}, expected=stored)
    with pytest.raises(StaleOffsetError), store.transaction() as conn:
        o.advance(conn, G, T, {0: 2}, expected={0: 0})
    with store.transaction() as conn:
        assert o.read(conn, G, T) == {0: 1}


@pytest.mark.parametrize("bad", [-1, 1.5, None])
def test_a_negative_or_non_integer_offset_is_refused(store: Store, bad: object) -> None:
    o = offsets(store)
    with pytest.raises(ValueError, match="integers ≥ 0"), store.transaction() as conn:
        o.advance(conn, G, T, {0: bad}, expected={})  # type: ignore[dict-item]
    assert rows(store) == set()
