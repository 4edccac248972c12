"""Migration 0003: every new execution and every change of its ``last_seq`` is notified on PostgreSQL
(rows written by COPY too); the trigger comes and goes with the migration."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from sapwood.platform.events import PartialScore
from sapwood.platform.storage.postgres.bulkcopy import COPY_MIN_ROWS
from sapwood.platform.storage.postgres.execution_versions import CHANNEL, TRIGGER
from sapwood.platform.store import Store
from tests.support.histories import small_execution

pytestmark = pytest.mark.postgres


@pytest.fixture
def listener(pg_url: str) -> Iterator[psycopg.Connection]:
    url = make_url(pg_url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"LISTEN {CHANNEL}")
        yield conn


def received(conn: psycopg.Connection) -> list[str]:
    return [n.payload for n in conn.notifies(timeout=0.5) if n.channel == CHANNEL]


def has_trigger(store: Store) -> bool:
    with store.engine.connect() as conn:
        return bool(conn.execute(sa.text("SELECT count(*) FROM pg_trigger WHERE tgname = :n"), {"n": TRIGGER})
                    .scalar_one())


def test_inserts_copies_and_updates_notify_the_new_last_seq(pg_url: str, listener: psycopg.Connection) -> None:
    store = Store.open(pg_url)
    one = small_execution(0)
    store.apply(one.events)
    last = one.events[-1].seq
    assert received(listener) == [f"{one.execution_id} {last}"]  # INSERT: one notification per execution

    many = [small_execution(seed, calls=2, forks=0, segments=0) for seed in range(1, COPY_MIN_ROWS + 2)]
    store.apply([e for w in many for e in w.events])  # enough new executions for bulk_insert to COPY
    assert sorted(received(listener)) == sorted(f"{w.execution_id} {w.events[-1].seq}" for w in many)

    store.apply([PartialScore(execution_id=one.execution_id, seq=last + 1, score=0.5)])  # UPDATE
    assert received(listener) == [f"{one.execution_id} {last + 1}"]

    with store.transaction() as conn:  # an update that leaves last_seq alone stays quiet
        conn.execute(sa.text("UPDATE executions SET last_seq = last_seq, reward = reward"))
    assert received(listener) == []
    store.close()


def test_trigger_follows_the_migration(pg_url: str, listener: psycopg.Connection) -> None:
    store = Store.open(pg_url)
    w = small_execution(0)
    store.apply(w.events)
    received(listener)
    assert has_trigger(store)
    store.downgrade("0002")
    assert not has_trigger(store)
    with store.transaction() as conn:  # raw SQL: later revisions' code may need their columns
        conn.execute(sa.text("UPDATE executions SET last_seq = last_seq + 1"))
    assert received(listener) == []
    store.migrate()
    assert has_trigger(store)
    last = w.events[-1].seq + 1
    store.apply([PartialScore(execution_id=w.execution_id, seq=last + 1, score=0.5)])
    assert received(listener) == [f"{w.execution_id} {last + 1}"]
    store.close()
