"""Run queue contract: claim, renew, complete, release and snapshots behave the same on SQLite and PostgreSQL."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import pytest
import sqlalchemy as sa

from sapwood.platform.errors import ConflictError
from sapwood.platform.execution_filter import ExecutionFilter
from sapwood.platform.storage.backends import run_queue
from sapwood.platform.storage.runs import RunKind, RunQueue
from sapwood.platform.storage.runs_sql import replay_order_key
from sapwood.platform.store import Store
from sapwood.platform.writer import ExecutionWriter

T0 = 1_000.0  # a claim's "now" in these tests (unix seconds); leases end at T0 + lease_s exactly
LEASE = 10.0


def _record(store: Store, n: int, *, run_id: str = "src", finish: bool = True) -> list[str]:
    """``n`` one-prompt executions recorded under ``run_id`` (finished unless ``finish`` is False); their ids."""
    ids = []
    for i in range(n):
        w = ExecutionWriter(run_id=run_id, task_id=f"task-{i}")
        w.start()
        w.prompt([1, 2, 3, i])
        if finish:
            w.finish("success", reward=float(i))
        store.apply(w.events)
        ids.append(w.execution_id)
    return ids


def _create(store: Store, run_id: str = "r", *, kind: RunKind = "replay", seed: int = 0, source: str = "src") -> int:
    with store.transaction() as conn:
        q = run_queue(conn)
        flt = ExecutionFilter(run_id=source)
        q.create(conn, run_id, kind=kind, filter_json=flt.model_dump(exclude_none=True), seed=seed,
                 config={}, description="", created_at=T0)
        return q.snapshot(conn, run_id, flt, kind=kind, seed=seed, now=T0) if kind == "replay" else 0


def _queue(store: Store) -> RunQueue:
    return run_queue(store.engine)


def test_claim_renew_complete_release(store: Store) -> None:
    _record(store, 5)
    assert _create(store) == 5
    q = _queue(store)
    with store.transaction() as conn:
        got = q.claim(conn, "r", "a", 2, lease_s=LEASE, now=T0)
        assert len(got) == 2
        assert q.progress(conn, "r") == {"pending": 3, "claimed": 2, "done": 0}
        assert q.renew(conn, "r", "a", got, lease_s=LEASE, now=T0 + 5) == 2
        assert q.renew(conn, "r", "b", got, lease_s=LEASE, now=T0 + 5) == 0, "b holds none of them"
        q.release(conn, "r", "a", got[:1])
        assert q.progress(conn, "r") == {"pending": 4, "claimed": 1, "done": 0}
        assert q.renew(conn, "r", "a", got, lease_s=LEASE, now=T0 + 6) == 1, "a gave the first one back"
        assert q.complete(conn, "r", "a", [got[1]], now=T0 + 7) == []
        assert q.complete(conn, "r", "a", [got[1]], now=T0 + 8) == [got[1]], "done already: no longer held"
        assert q.progress(conn, "r") == {"pending": 4, "claimed": 0, "done": 1}
        rest = q.claim(conn, "r", "b", 10, lease_s=LEASE, now=T0 + 9)
        assert len(rest) == 4, "released is claimable, done is not"
        assert got[0] in rest, "released is claimable, done is not"
        assert got[1] not in rest, "released is claimable, done is not"
        assert q.claim(conn, "r", "c", 10, lease_s=LEASE, now=T0 + 9) == []
        assert q.complete(conn, "r", "b", rest, now=T0 + 9) == []
        assert q.progress(conn, "r") == {"pending": 0, "claimed": 0, "done": 5}


@pytest.fixture
def one_claimed(store: Store) -> str:
    """A run ``r`` of one execution, claimed by learner ``a`` at T0 until T0 + LEASE; its id."""
    _record(store, 1)
    _create(store)
    with store.transaction() as conn:
        (eid,) = _queue(store).claim(conn, "r", "a", 1, lease_s=LEASE, now=T0)
    return eid


def test_a_lease_holds_at_its_end_and_is_reclaimable_just_after(store: Store, one_claimed: str) -> None:
    q, eid, end = _queue(store), one_claimed, T0 + LEASE
    with store.transaction() as conn:
        assert q.claim(conn, "r", "b", 1, lease_s=LEASE, now=end) == [], "at lease_until the lease still holds"
        assert q.claim(conn, "r", "b", 1, lease_s=LEASE, now=math.nextafter(end, math.inf)) == [eid]
        assert q.renew(conn, "r", "a", [eid], lease_s=LEASE, now=end) == 0, "a was taken over"
        assert q.complete(conn, "r", "a", [eid], now=end) == [eid]
        assert q.complete(conn, "r", "b", [eid], now=end) == []
        attempts = conn.execute(sa.text("SELECT attempts FROM run_items WHERE run_id = 'r'")).scalar_one()
        assert attempts == 2


def test_an_expired_lease_still_renews_while_nobody_took_it(store: Store, one_claimed: str) -> None:
    q, eid = _queue(store), one_claimed
    with store.transaction() as conn:
        assert q.renew(conn, "r", "a", [eid], lease_s=LEASE, now=T0 + 3 * LEASE) == 1
        assert q.claim(conn, "r", "b", 1, lease_s=LEASE, now=T0 + 3 * LEASE) == [], "renewed from its renewal time"
        assert q.complete(conn, "r", "a", [eid], now=T0 + 3 * LEASE) == []


def test_releasing_items_not_held_changes_nothing(store: Store) -> None:
    ids = _record(store, 3)
    _create(store)
    q = _queue(store)
    with store.transaction() as conn:
        (mine,) = q.claim(conn, "r", "b", 1, lease_s=LEASE, now=T0)
        pending = [e for e in ids if e != mine]
        # a learner releasing what it never claimed, another's claim, and an unknown id: no error, no effect
        q.release(conn, "r", "a", [*pending, mine, "00000000-0000-0000-0000-000000000000"])
        assert q.progress(conn, "r") == {"pending": 2, "claimed": 1, "done": 0}
        assert q.renew(conn, "r", "b", [mine], lease_s=LEASE, now=T0) == 1, "b still holds its claim"


def test_replay_snapshot_is_the_seeds_order_and_is_taken_once(store: Store) -> None:
    ids = _record(store, 6)
    _record(store, 1, finish=False)  # running: not queued
    _record(store, 2, run_id="other")  # outside the filter
    assert _create(store, "x", seed=42) == 6
    assert _create(store, "y", seed=42) == 6
    q = _queue(store)
    with store.transaction() as conn:
        order_x = q.claim(conn, "x", "a", 100, lease_s=LEASE, now=T0)
        order_y = q.claim(conn, "y", "a", 100, lease_s=LEASE, now=T0)
        assert order_x == order_y == sorted(ids, key=lambda e: replay_order_key(42, e))
        assert q.snapshot(conn, "x", ExecutionFilter(run_id="src"), kind="replay", seed=42, now=T0) == 0
    assert _record(store, 1)
    assert _create(store, "z", seed=7) == 7


def test_live_snapshot_follows_finish_order_and_adds_new_executions(store: Store) -> None:
    first = _record(store, 3)
    assert _create(store, "live", kind="live") == 0
    q = _queue(store)
    flt = ExecutionFilter(run_id="src")
    with store.transaction() as conn:
        assert q.snapshot(conn, "live", flt, kind="live", seed=0, now=T0) == 3
    later = _record(store, 2)
    with store.transaction() as conn:
        assert q.snapshot(conn, "live", flt, kind="live", seed=0, now=T0 + 1) == 2
        assert q.snapshot(conn, "live", flt, kind="live", seed=0, now=T0 + 2) == 0
        got = q.claim(conn, "live", "a", 100, lease_s=LEASE, now=T0)
    assert set(got[:3]) == set(first), "older snapshots come first"
    assert set(got[3:]) == set(later), "older snapshots come first"


def test_runs_are_created_once_and_read_back(store: Store) -> None:
    _create(store)
    q = _queue(store)
    with store.transaction() as conn:
        with pytest.raises(ConflictError, match="run 'r' already exists"):
            q.create(conn, "r", kind="live", filter_json={}, seed=0, config={}, description="", created_at=T0)
        row = q.get(conn, "r")
        assert row is not None
        assert row["kind"] == "replay"
        assert row["filter"] == {"run_id": "src"}
        assert row["created_at"] == T0
        assert q.get(conn, "missing") is None


def test_concurrent_claimers_take_every_item_once(store: Store) -> None:
    ids = _record(store, 12)
    _create(store)

    def drain(name: str) -> list[str]:
        """Claim two at a time, one transaction per claim, until the run is empty."""
        mine: list[str] = []
        while True:
            with store.transaction() as conn:
                got = run_queue(conn).claim(conn, "r", name, 2, lease_s=600.0)
            if not got:
                return mine
            mine += got

    with ThreadPoolExecutor(3) as pool:
        taken = list(pool.map(drain, ["L0", "L1", "L2"], timeout=60))
    assert sorted(e for mine in taken for e in mine) == sorted(ids), "each item claimed exactly once"


@pytest.mark.postgres
def test_postgres_claimers_in_open_transactions_skip_each_others_rows(pg_url: str) -> None:
    """Two transactions claiming at once get disjoint items and the second does not wait for the first."""
    store = Store.open(pg_url)
    try:
        _record(store, 6)
        _create(store)
        q = run_queue(store.engine)
        with store.engine.connect() as a, store.engine.connect() as b:
            ta, tb = a.begin(), b.begin()
            b.exec_driver_sql("SET LOCAL lock_timeout = '2s'")  # waiting on a's locks would fail, not hang
            got_a = q.claim(a, "r", "a", 3, lease_s=LEASE)
            got_b = q.claim(b, "r", "b", 3, lease_s=LEASE)
            assert len(got_a) == 3
            assert len(got_b) == 3
            assert not set(got_a) & set(got_b)
            ta.commit()
            tb.commit()
        with store.transaction() as conn:
            assert q.progress(conn, "r") == {"pending": 0, "claimed": 6, "done": 0}
    finally:
        store.close()


def test_unknown_dialect_is_refused() -> None:
    with pytest.raises(ValueError, match="no run queue for dialect 'mysql'; expected 'sqlite' or 'postgresql'"):
        run_queue("mysql")
