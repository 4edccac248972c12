"""Scheduler: cells and their roles, and every role decision with the signals it was made on (read scope)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from pydantic import Field

from sapwood.api.deps import CursorQuery, LimitDep, ReadKey, Seconds, ServicesDep
from sapwood.api.queries import scheduler as q
from sapwood.api.routes import AUTH_ERRORS
from sapwood.api.schemas import NO_NUL, _Out
from sapwood.platform.events import CellRole

router = APIRouter(tags=["scheduler"], responses=AUTH_ERRORS)


class CellOut(_Out):
    cell_id: str
    tier: str = Field(description="core (holds the authoritative parameters) or satellite")
    capacity: int = Field(description="concurrent rollouts the cell serves in the rollout role")
    role: str = Field(description="rollout / train / idle: the last role assigned")
    role_since: float = Field(description="unix seconds of the last role change")
    registered_at: float
    last_heartbeat_at: float
    heartbeats: int
    role_changes: int
    switch_s: float = Field(description="seconds spent in switch phases, in total")
    last_phase: str | None
    metadata: dict[str, Any]
    lost: bool = Field(description="no heartbeat for longer than lost_after_s")
    silent_s: float = Field(description="seconds since the last heartbeat")


class CellPage(_Out):
    items: list[CellOut]
    next_cursor: str | None


class DecisionOut(_Out):
    event_id: str
    cell_id: str
    role: str
    previous_role: str
    reason: str
    policy: str
    signals: dict[str, Any] = Field(description="the signal snapshot the policy decided on")
    decided_at: float


class DecisionPage(_Out):
    items: list[DecisionOut]
    next_cursor: str | None


@router.get("/v1/cells", response_model=CellPage)
def list_cells(services: ServicesDep, _key: ReadKey, limit: LimitDep, cursor: CursorQuery = None,
               lost_after_s: Annotated[float, Query(gt=0, le=86400, allow_inf_nan=False,
                                                    description="a cell silent longer than this is lost")] = 30.0,
               ) -> dict[str, Any]:
    """Cells ordered by id: tier, capacity, current role, heartbeats and whether the cell is lost."""
    with services.read() as conn:
        return q.list_cells(conn, limit=limit, cursor=cursor, cursors=services.cursors, lost_after_s=lost_after_s)


@router.get("/v1/scheduler/decisions", response_model=DecisionPage)
def list_decisions(
    services: ServicesDep, _key: ReadKey, limit: LimitDep, cursor: CursorQuery = None,
    cell_id: Annotated[str | None, Query(min_length=1, max_length=128, pattern=NO_NUL)] = None,
    role: CellRole | None = None,
    after: Seconds = None, before: Seconds = None,
) -> dict[str, Any]:
    """Role decisions oldest first, each with its reason and signal snapshot; filter by cell, role, [after, before)."""
    with services.read() as conn:
        return q.list_decisions(conn, limit=limit, cursor=cursor, cursors=services.cursors, cell_id=cell_id,
                                role=role, after=after, before=before)
