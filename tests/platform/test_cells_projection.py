"""Cell events (registered, heartbeat, role assigned, switch phase): codec, apply, the cells projection, rebuilds."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from sapwood.platform import schema as t
from sapwood.platform.codec import decode, encode, peek_key
from sapwood.platform.errors import UnknownParentError, ValidationError
from sapwood.platform.events import CellHeartbeat, CellRegistered, RoleAssigned, SwitchPhase
from sapwood.platform.store import Store
from tests.support.histories import small_execution


def cell_history(t0: float = 1000.0) -> list:
    return [
        CellRegistered(cell_id="cell-7", tier="satellite", capacity=4, created_at=t0),
        CellRegistered(cell_id="cell-1", tier="core", capacity=4, created_at=t0),
        RoleAssigned(cell_id="cell-7", role="rollout", previous_role="idle", reason="initial", policy="elastic",
                     signals={"backlog_executions": 0}, created_at=t0 + 1),
        CellHeartbeat(cell_id="cell-7", status={"busy_slots": 3}, created_at=t0 + 5),
        RoleAssigned(cell_id="cell-7", role="train", previous_role="rollout", policy="elastic",
                     reason="surplus: capacity 8 exceeds demand 2", signals={"rollout_demand": 2}, created_at=t0 + 60),
        SwitchPhase(cell_id="cell-7", phase="drain", duration_s=1.5, role="train", created_at=t0 + 61.5),
        SwitchPhase(cell_id="cell-7", phase="load", duration_s=4.0, role="train", created_at=t0 + 65.5),
        CellHeartbeat(cell_id="cell-7", created_at=t0 + 70),
        CellHeartbeat(cell_id="cell-7", created_at=t0 + 69),  # late heartbeat: last_heartbeat_at does not go back
    ]


def test_cells_projection_and_decisions(store: Store) -> None:
    store.apply(cell_history())
    with store.transaction() as conn:
        cells = {r.cell_id: r for r in conn.execute(sa.select(t.cells))}
        decisions = conn.execute(sa.select(t.scheduler_decisions).order_by(t.scheduler_decisions.c.decided_at)).all()
        phases = conn.execute(sa.select(t.switch_phases)).all()
    c7 = cells["cell-7"]
    assert (c7.tier, c7.capacity, c7.role, c7.role_since) == ("satellite", 4, "train", 1060.0)
    assert (c7.heartbeats, c7.last_heartbeat_at, c7.role_changes) == (3, 1070.0, 2)
    assert c7.switch_s == pytest.approx(5.5)
    assert c7.last_phase == "load"
    assert cells["cell-1"].role == "idle"
    assert cells["cell-1"].heartbeats == 0
    assert [d.role for d in decisions] == ["rollout", "train"]
    assert decisions[1].signals == {"rollout_demand": 2}
    assert "surplus" in decisions[1].reason
    assert sorted(p.phase for p in phases) == ["drain", "load"]


def test_cells_projection_rebuilds_identically(store: Store) -> None:
    store.apply(small_execution(1).events)
    store.apply(cell_history())
    store.apply([RoleAssigned(cell_id="cell-1", role="train", previous_role="idle", reason="r", created_at=2000.0)])
    live = store.projection_hash()
    with store.transaction() as conn:
        n_cells = conn.execute(sa.select(sa.func.count()).select_from(t.cells)).scalar_one()
    assert n_cells == 2
    store.rebuild_projections()
    assert store.projection_hash() == live
    # the hash covers the cells projection: changing a row changes it
    with store.transaction() as conn:
        conn.execute(t.cells.update().where(t.cells.c.cell_id == "cell-1").values(role="idle"))
    assert store.projection_hash() != live


def test_cell_event_for_unknown_cell_is_rejected(store: Store) -> None:
    with pytest.raises(UnknownParentError, match="unknown cell 'ghost'"):
        store.apply([CellHeartbeat(cell_id="ghost")])
    with store.transaction() as conn:
        assert conn.execute(sa.select(t.cells)).all() == []


def test_reregistration_updates_capacity_and_keeps_role(store: Store) -> None:
    store.apply(cell_history())
    store.apply([CellRegistered(cell_id="cell-7", tier="core", capacity=8, created_at=3000.0)])
    with store.transaction() as conn:
        row = conn.execute(sa.select(t.cells).where(t.cells.c.cell_id == "cell-7")).one()
    assert (row.tier, row.capacity, row.role, row.last_heartbeat_at) == ("core", 8, "train", 3000.0)


@pytest.mark.parametrize(
    ("event", "message"),
    [
        (lambda: CellRegistered(cell_id="c", tier="gpu"), "tier"),
        (lambda: CellRegistered(cell_id="c", capacity=0), "capacity"),
        (lambda: CellRegistered(cell_id=""), "cell_id"),
        (lambda: RoleAssigned(cell_id="c", role="dance"), "role"),
        (lambda: SwitchPhase(cell_id="c", phase="load", duration_s=float("nan")), "duration_s"),
        (lambda: SwitchPhase(cell_id="c", phase="", duration_s=1.0), "phase"),
        (lambda: CellHeartbeat(cell_id="c", seq=3), "cell-scoped"),
    ],
)
def test_cell_events_validate(event, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValidationError, match=message):
        event().validate()


def test_cell_events_round_trip_the_codec_and_key_by_cell() -> None:
    for ev in cell_history():
        back = decode(encode(ev))
        assert type(back) is type(ev)
        assert back.scalar_fields() == ev.scalar_fields()
        assert peek_key(ev) == ev.cell_id.encode()
