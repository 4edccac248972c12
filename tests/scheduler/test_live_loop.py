"""The live loop on a real store: decisions become role_assigned events, the projection follows, no repeats."""

from __future__ import annotations

import time

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from sapwood.platform import runs
from sapwood.platform import schema as t
from sapwood.platform.cli import app
from sapwood.platform.events import CellHeartbeat, CellRegistered, ExecutionFinished
from sapwood.platform.store import Store
from sapwood.rollout.transports import InProcessTransport
from sapwood.scheduler.live_loop import LoggingActuator, SchedulerLoop
from sapwood.scheduler.live_signals import LiveSignalReader
from sapwood.scheduler.policies import ElasticPolicy
from tests.support.histories import small_execution


def fill(store: Store, now: float) -> None:
    for s in range(4):  # four finished executions in a live run: one batch of 4 waits to be trained
        store.apply(small_execution(s).events)
    for s in (10, 11):  # two rollouts in flight
        store.apply([e for e in small_execution(s).events if not isinstance(e, ExecutionFinished)])
    with store.transaction() as conn:
        runs.create_run(conn, "live", runs.ExecutionFilter(run_id="synthetic"), kind="live")
    store.apply([CellRegistered(cell_id=f"cell-{i}", capacity=2, created_at=now - 50) for i in range(4)])
    store.apply([CellHeartbeat(cell_id=f"cell-{i}", created_at=now) for i in range(3)])  # cell-3 never beats


def test_loop_records_decisions_as_events_and_does_not_repeat_them(pg_url: str) -> None:
    store = Store.open(pg_url)
    now = time.time()
    fill(store, now)
    reader = LiveSignalReader(store.engine, batch_size=4, train_step_cell_s=600.0, lost_after_s=30)
    actuator = LoggingActuator()
    loop = SchedulerLoop(reader.read, ElasticPolicy(min_dwell_s=0), InProcessTransport(store, batch_size=1),
                         actuator)
    first = loop.tick()
    assert first.signals.backlog_executions == 4
    assert first.signals.in_flight == 2
    assert {c.cell_id for c in first.signals.cells if c.lost} == {"cell-3"}
    roles = set(first.moves.values())
    assert ("idle", "train") in roles, first.decision.reasons
    assert ("idle", "rollout") in roles, first.decision.reasons
    assert "cell-3" not in first.moves, "a lost cell is never given work"
    with store.engine.connect() as conn:
        decisions = conn.execute(sa.select(t.scheduler_decisions)).mappings().all()
        cells = {r.cell_id: r.role for r in conn.execute(sa.select(t.cells))}
    assert len(decisions) == len(first.moves) == len(actuator.moves)
    for d in decisions:
        assert d["reason"]
        assert d["policy"] == "elastic"
        assert d["signals"]["backlog_executions"] == 4
        assert d["signals"]["in_flight"] == 2
        assert cells[d["cell_id"]] == d["role"]
    second = loop.tick()
    assert all(second.moves.get(c) is None for c in first.moves), "a move already made is not made again"
    live = store.projection_hash()
    store.rebuild_projections()
    assert store.projection_hash() == live
    store.close()


def test_run_command_ticks_and_exits(pg_url: str) -> None:
    store = Store.open(pg_url)
    fill(store, time.time())
    store.close()
    result = CliRunner().invoke(app, ["scheduler", "run", "--database-url", pg_url, "--batch-size", "4",
                                      "--ticks", "2", "--tick-s", "0.05", "--policy-arg", "min_dwell_s=0"])
    assert result.exit_code == 0, result.output
    bad = CliRunner().invoke(app, ["scheduler", "run", "--database-url", pg_url, "--policy-arg", "oops"])
    assert bad.exit_code != 0
    assert "NAME=VALUE" in bad.output
    store = Store.open(pg_url)
    with store.engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(t.scheduler_decisions)).scalar_one() >= 2
    store.close()


def test_a_decision_is_recorded_only_after_its_move_returned() -> None:
    from sapwood.scheduler.policy import Decision
    from sapwood.scheduler.signals import CellState, Signals

    class Sent:
        def __init__(self) -> None:
            self.events: list[object] = []

        def send(self, event: object) -> None:  # sent at once, as the store and Kafka transports do
            self.events.append(event)

        def flush(self, timeout: float | None = None) -> None:
            pass

    class ParkC0:
        name = "park-c0"

        def decide(self, signals: Signals, assignment: dict) -> Decision:  # type: ignore[type-arg]
            return Decision(target={**assignment, "c0": "idle"}, reasons={"c0": "test"})

    class Dies:
        def move(self, cell_id: str, from_role: str, to_role: str, reason: str) -> list[tuple[str, float]]:
            raise RuntimeError("the switch failed half-way")

    sink = Sent()
    cells = (CellState(cell_id="c0", role="rollout", capacity=2), CellState(cell_id="c1", role="rollout", capacity=2))
    loop = SchedulerLoop(lambda: Signals(at_s=time.time(), cells=cells, batch_size=4), ParkC0(), sink, Dies())
    with pytest.raises(RuntimeError, match="half-way"):
        loop.tick()
    assert sink.events == []  # no role_assigned for a move that never finished: the next tick decides again
    loop.actuator = LoggingActuator()
    assert loop.tick().moves == {"c0": ("rollout", "idle")}
    assert [e.kind for e in sink.events] == ["role_assigned"]  # type: ignore[attr-defined]
