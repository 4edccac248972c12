"""The scheduler's store reads on SQLite and PostgreSQL: cells and decisions pages, backlog, in-flight, phases."""

from __future__ import annotations

import math
import time
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from sapwood.platform import runs
from sapwood.platform import schema as t
from sapwood.platform.events import CellHeartbeat, CellRegistered, PolicyPublished, RoleAssigned, SwitchPhase
from sapwood.platform.storage.backends import offset_store, run_queue
from sapwood.platform.storage.cells import cells, decisions
from sapwood.platform.storage.scheduler_signals import LiveRuns, RunBacklogRow, StoreSignals, read_snapshot
from sapwood.platform.store import Store
from sapwood.platform.writer import ExecutionWriter

NOW = time.time()


def _snap(conn: Connection, now: float, **kw: Any) -> StoreSignals:
    return read_snapshot(conn, LiveRuns(), now, 600.0, **kw)


def _backlogs(conn: Connection, now: float) -> list[RunBacklogRow]:
    return _snap(conn, now).backlogs


def _execution(store: Store, outputs: int, *, finish: bool = True, version: int = 0) -> str:
    w = ExecutionWriter(run_id="src", task_id="t")
    w.start()
    p = w.prompt([1, 2, 3])
    w.call(p.node_id, [4], list(range(outputs)), [-0.5] * outputs, policy_version=version)
    if finish:
        w.finish("success", reward=1.0)
    store.apply(w.events)
    return w.execution_id


def test_cells_in_id_order_a_page_at_a_time(store: Store) -> None:
    store.apply([CellRegistered(cell_id=f"c{i}", capacity=i + 1, created_at=NOW - 10) for i in (2, 0, 3, 1)])
    store.apply([CellHeartbeat(cell_id="c1", created_at=NOW - 1)])
    with store.transaction() as conn:
        assert [r["cell_id"] for r in cells(conn)] == ["c0", "c1", "c2", "c3"]
        (page,) = cells(conn, after="c1", limit=1)
        assert page["cell_id"] == "c2"
        assert page["capacity"] == 3
        assert cells(conn, after="c3") == []
        (c1,) = [r for r in cells(conn) if r["cell_id"] == "c1"]
        assert c1["last_heartbeat_at"] == pytest.approx(NOW - 1)


def test_decisions_filter_by_cell_role_and_a_half_open_window(store: Store) -> None:
    store.apply([CellRegistered(cell_id=c, created_at=NOW - 100) for c in ("a", "b")])
    store.apply([RoleAssigned(cell_id="ab"[i % 2], role="train" if i % 3 else "rollout", reason=f"d{i}",
                              created_at=NOW - 50 + i) for i in range(6)])
    with store.transaction() as conn:
        everything = decisions(conn, limit=100)
        assert [d["reason"] for d in everything] == [f"d{i}" for i in range(6)]
        assert all(isinstance(d["event_id"], str) for d in everything)
        assert [d["reason"] for d in decisions(conn, limit=100, cell_id="a")] == ["d0", "d2", "d4"]
        assert [d["reason"] for d in decisions(conn, limit=100, role="rollout")] == ["d0", "d3"]
        window = decisions(conn, limit=100, decided_from=everything[1]["decided_at"],
                           decided_before=everything[4]["decided_at"])
        assert [d["reason"] for d in window] == ["d1", "d2", "d3"], "from is inclusive, before exclusive"
        key = (everything[2]["decided_at"], everything[2]["event_id"])
        assert [d["reason"] for d in decisions(conn, limit=2, after=key)] == ["d3", "d4"]


def test_backlog_counts_what_no_learner_holds(store: Store) -> None:
    held, expiring, free = _execution(store, 5, version=1), _execution(store, 7, version=2), _execution(store, 11)
    _execution(store, 13, finish=False)  # running: not backlog
    store.apply([PolicyPublished(run_id="pub", version=4)])
    with store.transaction() as conn:
        runs.create_run(conn, "live", runs.ExecutionFilter(run_id="src"), kind="live", config={"publish_run_id": "pub"})
        runs.create_run(conn, "replayed", runs.ExecutionFilter(run_id="src"))  # not live: no backlog row
        q = run_queue(conn)
        q.snapshot(conn, "live", runs.ExecutionFilter(run_id="src"), kind="live", seed=0, now=NOW)
        by_id = {eid: i for i, eid in enumerate(q.claim(conn, "live", "peek", 10, lease_s=0.0, now=NOW))}
        q.release(conn, "live", "peek", list(by_id))
        order = sorted(by_id, key=by_id.__getitem__)
        assert set(order) == {held, expiring, free}
        q.claim(conn, "live", "a", 1, lease_s=100.0, now=NOW)  # takes the first in run order
        q.claim(conn, "live", "b", 1, lease_s=10.0, now=NOW)
        first, second, third = order
        tokens = {held: 5, expiring: 7, free: 11}
        (at_end,) = _backlogs(conn, NOW + 10.0)
        assert (at_end.run_id, at_end.executions, at_end.output_tokens) == ("live", 1, tokens[third])
        assert at_end.latest_published == 4
        (after,) = _backlogs(conn, math.nextafter(NOW + 10.0, math.inf))
        assert (after.executions, after.output_tokens) == (2, tokens[second] + tokens[third]), "b's lease ended"
        assert q.complete(conn, "live", "a", [first], now=NOW) == []
        (done,) = _backlogs(conn, NOW + 200.0)
        assert (done.executions, done.output_tokens) == (2, tokens[second] + tokens[third]), "done is not backlog"
        versions = {held: 1, expiring: 2, free: 0}
        assert done.oldest_policy_version == min(versions[second], versions[third])


def test_in_flight_switch_phases_and_stored_offsets(store: Store) -> None:
    began = time.time()  # not the module's NOW: the whole suite may have run minutes since its import
    _execution(store, 3)
    _execution(store, 3, finish=False)
    store.apply([CellRegistered(cell_id="c", created_at=NOW - 100)])
    store.apply([SwitchPhase(cell_id="c", phase=f"p{i}", duration_s=float(i), role="train", created_at=NOW - 10 + i)
                 for i in range(4)])
    with store.transaction() as conn:
        conn.execute(t.consumer_offsets.insert(), [
            {"group_id": "g", "topic": "x", "partition": p, "next_offset": 10 * p, "updated_at": NOW} for p in (0, 2)])
        conn.execute(t.consumer_offsets.insert(), [
            {"group_id": "other", "topic": "x", "partition": 1, "next_offset": 99, "updated_at": NOW}])
        snap = _snap(conn, began + 1000.0, offsets=("g", "x"), switch_last=3)
        assert snap.in_flight == 1
        assert snap.oldest_running_started_at is not None
        assert 0.0 < snap.oldest_running_started_at - began < 60.0, "started after NOW, within the test"
        assert snap.switch_phases == [("c", "train", 3.0), ("c", "train", 2.0), ("c", "train", 1.0)]
        assert snap.stored_offsets == {0: 0, 2: 20}, "only group g's offsets of topic x"
        assert [c.cell_id for c in snap.cells] == ["c"]
        assert snap.completions == 0, "finished ~1000 s before: outside the 600 s window"
        assert len(snap.durations) == 1, "the latest finished durations have no window"
        assert _snap(conn, time.time()).completions == 1
        assert offset_store(conn).read(conn, "g", "x") == {0: 0, 2: 20}
        assert offset_store(conn).read(conn, "g", "y") == {}


def test_a_snapshot_is_one_statement_and_new_live_runs_are_seen(store: Store) -> None:
    _execution(store, 5)
    statements: list[str] = []

    def count(*args: Any) -> None:
        statements.append(args[2])

    live = LiveRuns()
    with store.transaction() as conn:
        runs.create_run(conn, "live", runs.ExecutionFilter(run_id="src"), kind="live")
    with store.transaction() as conn:
        _ = read_snapshot(conn, live, NOW + 1.0, 600.0)  # first: reads the live runs once
        sa.event.listen(conn, "before_cursor_execute", count)
        snap = read_snapshot(conn, live, NOW + 1.0, 600.0)
        sa.event.remove(conn, "before_cursor_execute", count)
    assert len(statements) == 1, statements
    assert [(b.run_id, b.executions) for b in snap.backlogs] == [("live", 1)]
    with store.transaction() as conn:
        runs.create_run(conn, "live-2", runs.ExecutionFilter(run_id="src"), kind="live")
        statements.clear()
        sa.event.listen(conn, "before_cursor_execute", count)
        snap = read_snapshot(conn, live, NOW + 1.0, 600.0)
        sa.event.remove(conn, "before_cursor_execute", count)
    assert len(statements) == 3, "the stamp changed: runs read again, then the snapshot again"
    assert [(b.run_id, b.executions) for b in snap.backlogs] == [("live", 1), ("live-2", 1)]
