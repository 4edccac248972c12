"""The offset committer against a real SQLite store; the Kafka side is a recording stand-in (the whole
flow with a broker is tests/ingest/test_ingest_service.py)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from sapwood.ingest.committer import NOT_ASSIGNED, OffsetCommitter
from sapwood.platform.storage.backends import offset_store
from sapwood.platform.store import Store
from tests.support.kafka_ingest import FakeRecord as Record
from tests.support.kafka_ingest import FakeTopicPartition as TP

G, T = "g", "events"


@dataclass
class Consumer:
    """Records what the committer asks of the Kafka source."""

    assigned: set[Any] = field(default_factory=set)
    seeks: list[tuple[Any, int | None]] = field(default_factory=list)
    resumed: list[Any] = field(default_factory=list)
    copies: list[dict[Any, int]] = field(default_factory=list)

    def assignment(self) -> set[Any]:
        return set(self.assigned)

    def seek(self, tp: Any, offset: int | None) -> None:
        self.seeks.append((tp, offset))

    def resume(self, tps: Iterable[Any]) -> None:
        self.resumed.extend(tps)

    def commit_copy(self, offsets: Mapping[Any, int]) -> None:
        self.copies.append(dict(offsets))


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store.open(f"sqlite:///{tmp_path / 'store.db'}")
    yield s
    s.close()


def committer(store: Store, *tps: TP) -> tuple[OffsetCommitter, Consumer]:
    consumer = Consumer(assigned=set(tps))
    c = OffsetCommitter(G, T, consumer, commit_to_kafka=True)  # type: ignore[arg-type]
    c.bind(store)
    c.assign(tps)
    return c, consumer


def test_assignment_seeks_to_the_stored_offsets_or_the_beginning(store: Store) -> None:
    p0, p1 = TP(T, 0), TP(T, 1)
    with store.transaction() as conn:
        offset_store(conn).advance(conn, G, T, {0: 0}, expected={})
    c, consumer = committer(store, p0, p1)
    assert c.pending(), "unsynced partitions are not read"
    assert c.readable({p0: [Record(0)]}) == {}, "unsynced partitions are not read"
    c.sync(store, [p0, p1])
    assert sorted(consumer.seeks, key=lambda s: s[0].partition) == [(p0, 0), (p1, None)]
    assert c.held() == {0: 0, 1: None}
    assert not c.pending()
    assert c.readable({p0: [Record(0)], p1: []}) == {p0: [Record(0)]}


def test_a_batch_advances_from_the_position_and_skips_records_before_it(store: Store) -> None:
    p0, p1 = TP(T, 0), TP(T, 1)
    with store.transaction() as conn:
        offset_store(conn).advance(conn, G, T, {0: 5}, expected={})
    c, consumer = committer(store, p0, p1)
    c.sync(store, [p0, p1])
    with store.transaction() as conn:
        claim = c.claim(conn, {p0: [Record(3), Record(4), Record(5), Record(6)], p1: [Record(0)]})
        assert {tp.partition: [r.offset for r in rs] for tp, rs in claim.todo.items()} == {0: [5, 6], 1: [0]}
        c.advance(conn, claim)
    c.committed(claim)
    with store.transaction() as conn:
        assert offset_store(conn).read(conn, G, T) == {0: 7, 1: 1}
    assert c.held() == {0: 7, 1: 1}
    assert consumer.copies == [{p0: 7, p1: 1}], "Kafka gets a copy after the commit"


def test_a_zombie_whose_stored_offset_moved_applies_nothing_and_reseeks(store: Store) -> None:
    p0 = TP(T, 0)
    c, consumer = committer(store, p0)
    c.sync(store, [p0])  # nothing stored: position None
    with store.transaction() as conn:  # meanwhile another process stored offset 10
        offset_store(conn).advance(conn, G, T, {0: 10}, expected={})
    consumer.seeks.clear()
    with store.transaction() as conn:
        claim = c.claim(conn, {p0: [Record(0), Record(1)]})
        c.advance(conn, claim)
    c.committed(claim)
    assert claim.todo == {}
    assert claim.mismatched == {p0: 10}
    assert consumer.seeks == [(p0, 10)]
    assert c.held() == {0: 10}
    with store.transaction() as conn:
        assert offset_store(conn).read(conn, G, T) == {0: 10}


def test_revoked_partitions_are_neither_claimed_nor_reseeked(store: Store) -> None:
    p0 = TP(T, 0)
    c, consumer = committer(store, p0)
    c.sync(store, [p0])
    c.revoke([p0])
    assert c.position(p0) is NOT_ASSIGNED
    assert c.held() == {}
    with store.transaction() as conn:
        claim = c.claim(conn, {p0: [Record(0)]})
    assert claim.todo == {}
    assert claim.mismatched == {}
    c.reseek(p0, 3)
    assert consumer.seeks == [(p0, None)], "only the sync's seek"


def test_a_lost_database_marks_every_partition_for_a_re_read(store: Store) -> None:
    p0, p1 = TP(T, 0), TP(T, 1)
    c, _consumer = committer(store, p0, p1)
    c.sync(store, [p0, p1])
    assert set(c.unsync_all()) == {p0, p1}
    assert set(c.pending()) == {p0, p1}
    assert c.readable({p0: [Record(0)]}) == {}


def test_an_unbound_committer_says_what_is_missing() -> None:
    c = OffsetCommitter(G, T, Consumer())  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match=r"bind\(store\)"):
        c.claim(None, {})  # type: ignore[arg-type]
