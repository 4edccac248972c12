"""Execution versions pushed by PostgreSQL (LISTEN/NOTIFY): cached trees follow every writer, the listener
falls back to queries when its connection is lost and reconnects; the rules of the version map."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

from sapwood.api.deps import Services
from sapwood.api.versions import VersionMap, VersionReader
from sapwood.platform.events import PartialScore
from sapwood.platform.storage.postgres.version_channel import LISTENER_NAME, parse_payload
from sapwood.platform.store import Store
from sapwood.platform.writer import ExecutionWriter
from tests.support.api_client import Keys, TestClient, make_client

EID = "00000000-0000-4000-8000-000000000001"


def services(client: TestClient) -> Services:
    s: Services = client.app.state.sapwood
    return s


def wait_for(cond: Callable[[], bool], timeout_s: float = 2.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def tree(client: TestClient, keys: Keys, eid: str) -> tuple[dict[str, Any], str]:
    r = client.get(f"/v1/executions/{eid}/tree", headers=keys.headers("read"))
    assert r.status_code == 200, r.text
    return r.json(), r.headers["x-sapwood-cache"]


def count_queries(reader: VersionReader, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The execution ids whose version the reader asked the database for, from now on."""
    asked: list[str] = []
    query = reader._query

    async def counted(execution_id: str) -> int:
        asked.append(execution_id)
        return await query(execution_id)

    monkeypatch.setattr(reader, "_query", counted)
    return asked


def score_event(store: Store, eid: str, score: float) -> PartialScore:
    """The execution's next partial-score revision, as another writer would apply it."""
    with store.engine.connect() as conn:
        last_seq, revision = conn.execute(sa.text("SELECT last_seq, score_revision FROM executions "
                                                  "WHERE execution_id = :e"), {"e": eid}).one()
    return PartialScore(execution_id=eid, seq=last_seq + 1, score=score,
                        revision=0 if revision is None else revision + 1)


def terminate_listener(store: Store) -> int:
    with store.engine.connect() as conn:
        return len(conn.execute(sa.text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                        "WHERE application_name = :n AND datname = current_database()"),
                                {"n": LISTENER_NAME}).all())


# -- against PostgreSQL ------------------------------------------------------------------------------------
@pytest.fixture
def reader(client: TestClient) -> VersionReader:
    """The client's version reader, once its listener is live."""
    r = services(client).versions
    wait_for(lambda: r.map.live)
    return r


def test_cached_tree_follows_another_writer_without_queries(client: TestClient, reader: VersionReader, keys: Keys,
                                                            pg_store: Store, writers: list[ExecutionWriter],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    eid = writers[0].execution_id
    before, state = tree(client, keys, eid)
    assert state == "miss"
    asked = count_queries(reader, monkeypatch)
    for _ in range(5):
        assert tree(client, keys, eid) == (before, "hit")
    assert asked == [], "a cache hit reads the version from the pushed map, not from the database"

    pg_store.apply([score_event(pg_store, eid, 0.75)])  # another writer: only the notification tells the worker
    wait_for(lambda: tree(client, keys, eid)[0] != before)
    after, state = tree(client, keys, eid)
    assert after["execution"]["last_seq"] == before["execution"]["last_seq"] + 1
    assert after["scores"][-1]["score"] == 0.75
    assert state == "hit"
    assert asked == []


def test_score_revision_through_the_api_is_read_back_at_once(client: TestClient, reader: VersionReader,
                                                             keys: Keys, writers: list[ExecutionWriter],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    eid = writers[1].execution_id
    before, _ = tree(client, keys, eid)
    monkeypatch.setattr(reader.map, "notified", lambda *a: None)  # as if the notification were slow to come
    r = client.post(f"/v1/executions/{eid}/scores", headers=keys.headers("write"), json={"score": 0.125})
    assert r.status_code == 201, r.text
    after, _ = tree(client, keys, eid)
    assert after["execution"]["last_seq"] == before["execution"]["last_seq"] + 1
    assert after["scores"][-1]["score"] == 0.125


def test_lost_listener_falls_back_to_queries_and_reconnects(client: TestClient, reader: VersionReader, keys: Keys,
                                                            pg_store: Store, writers: list[ExecutionWriter],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    assert reader.connects == 1
    eid = writers[0].execution_id
    first, _ = tree(client, keys, eid)
    reader.min_backoff_s = 1.0  # a window without the listener to observe
    assert terminate_listener(pg_store) == 1
    wait_for(lambda: not reader.map.live)

    asked = count_queries(reader, monkeypatch)
    pg_store.apply([score_event(pg_store, eid, 0.5)])  # no notification reaches this worker now
    second, state = tree(client, keys, eid)  # the version is queried: the change shows at once
    assert second["execution"]["last_seq"] == first["execution"]["last_seq"] + 1
    assert state == "miss"
    assert tree(client, keys, eid) == (second, "hit")
    assert asked == [eid, eid]

    wait_for(lambda: reader.map.live and reader.connects == 2, timeout_s=5.0)
    pg_store.apply([score_event(pg_store, eid, 0.25)])
    wait_for(lambda: tree(client, keys, eid)[0]["execution"]["last_seq"] == second["execution"]["last_seq"] + 1)
    assert tree(client, keys, eid)[0]["scores"][-1]["score"] == 0.25


def test_without_the_trigger_versions_are_queried(keys: Keys, pg_store: Store,
                                                  writers: list[ExecutionWriter]) -> None:
    with pg_store.engine.begin() as conn:  # a database not (yet) migrated to 0003
        conn.execute(sa.text("DROP TRIGGER executions_notify_version ON executions"))
    with make_client(pg_store) as client:
        reader = services(client).versions
        eid = writers[0].execution_id
        before, _ = tree(client, keys, eid)
        pg_store.apply([score_event(pg_store, eid, 0.5)])
        after, _ = tree(client, keys, eid)
        assert after["execution"]["last_seq"] == before["execution"]["last_seq"] + 1
        assert not reader.map.live
        assert reader.connects == 0


def test_shutdown_closes_the_listener(keys: Keys, pg_store: Store, writers: list[ExecutionWriter]) -> None:
    def listeners() -> int:
        with pg_store.engine.connect() as conn:
            return int(conn.execute(sa.text("SELECT count(*) FROM pg_stat_activity WHERE application_name = :n "
                                            "AND datname = current_database()"), {"n": LISTENER_NAME}).scalar_one())

    with make_client(pg_store) as client:
        reader = services(client).versions
        wait_for(lambda: reader.map.live)
        assert listeners() == 1
    assert not reader.map.live
    assert reader._listener is None
    wait_for(lambda: listeners() == 0)


def test_sqlite_never_pushes(tmp_path: Any) -> None:
    store = Store.open(f"sqlite:///{tmp_path / 's.db'}")
    assert not VersionReader(store.engine, statement_timeout_ms=1000).push
    store.close()


# -- the map's rules -------------------------------------------------------------------------------------
def test_map_is_used_only_while_live() -> None:
    m = VersionMap()
    m.notified(EID, 3)
    assert m.get(EID) is None
    assert m.token() is None
    m.learn(EID, 3, m.token())
    assert len(m) == 0
    m.connected()
    m.notified(EID, 3)
    assert m.get(EID) == 3
    m.disconnected()
    assert m.get(EID) is None
    assert len(m) == 0
    m.connected()
    assert m.get(EID) is None, "a reconnect starts empty: notifications may have been missed meanwhile"


def test_versions_only_grow() -> None:
    m = VersionMap()
    m.connected()
    m.notified(EID, 5)
    m.notified(EID, 4)  # late or duplicate
    assert m.get(EID) == 5
    m.learn(EID, 2, m.token())  # a query answered from an older snapshot
    assert m.get(EID) == 5
    m.learn(EID, 7, m.token())
    assert m.get(EID) == 7


def test_answers_from_another_epoch_are_not_learned() -> None:
    m = VersionMap()
    m.connected()
    token = m.token()
    m.disconnected()
    m.connected()  # the listener reconnected while the query ran: a notification may be lost
    m.learn(EID, 2, token)
    assert m.get(EID) is None
    token = m.token()
    m.learn(EID, 2, token)
    assert m.get(EID) == 2


def test_full_map_is_cleared_and_invalidates_queries_in_flight() -> None:
    m = VersionMap(max_entries=2)
    m.connected()
    token = m.token()
    m.notified("a", 1)
    m.notified("b", 1)
    m.notified("b", 2)  # an update of a known entry does not count
    assert len(m) == 2
    m.notified("c", 1)
    assert len(m) == 1
    assert m.get("c") == 1
    assert m.get("a") is None
    m.learn("a", 0, token)  # its answer might predate a notification that the clear dropped
    assert m.get("a") is None


def test_payloads() -> None:
    assert parse_payload(f"{EID} 12") == (EID, 12)
    assert parse_payload(f"{EID.upper()} 12") == (EID, 12)
    assert parse_payload("nonsense") is None
    assert parse_payload(f"{EID} x") is None
