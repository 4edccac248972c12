"""Runs: training runs (replay/live queues) and the run ids executions were recorded under."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Request, Response
from sqlalchemy.engine import Connection

from sapwood.api import writes
from sapwood.api.deps import CursorQuery, LimitDep, ReadKey, ServicesDep, WriteKey
from sapwood.api.idempotency import Answer, IdempotencyKey, idempotent, json_bytes
from sapwood.api.queries import executions as q
from sapwood.api.queries.drift import run_drift
from sapwood.api.routes import AUTH_ERRORS, CONFLICT, NOT_FOUND, TOO_LARGE
from sapwood.api.schemas import NO_NUL, RunCreate, RunCreated, RunDriftDetail, RunItemsPage, RunOut, RunPage
from sapwood.platform.errors import ConflictError
from sapwood.platform.storage.errors import from_driver

router = APIRouter(prefix="/v1/runs", tags=["runs"], responses=AUTH_ERRORS)
RunIdPath = Annotated[str, Path(min_length=1, max_length=128, pattern=NO_NUL)]


@router.get("", response_model=RunPage)
def list_runs(services: ServicesDep, _key: ReadKey, limit: LimitDep, cursor: CursorQuery = None) -> dict[str, Any]:
    """Training runs and rollout run ids, ordered by run id, with queue progress and executions by status."""
    with services.read() as conn:
        return q.list_runs(conn, limit=limit, cursor=cursor, cursors=services.cursors)


@router.post("", response_model=RunCreated, status_code=201, responses={**CONFLICT, **TOO_LARGE})
def create_run(body: RunCreate, request: Request, services: ServicesDep, key: WriteKey,
               idempotency_key: IdempotencyKey = None) -> Response:
    """Create a training run from historical executions.

    A ``replay`` run snapshots the *finished* executions matching ``filter`` now, in an order fixed
    by ``seed``: the same filter and seed over the same history give the same executions in the
    same order. Learners then claim them (with their recorded rollout log-probs) through the run's queue.
    With an ``Idempotency-Key``, a retry gets the first answer (the same run) instead of a new run.
    """

    def work(conn: Connection) -> Answer:
        out = writes.create_run(conn, run_id=body.run_id, kind=body.kind, flt=body.filter, seed=body.seed,
                                description=body.description, config=body.config)
        return Answer(201, json_bytes(RunCreated, out))

    try:
        return idempotent(services, key, idempotency_key, request, body, work)[0]
    except ConflictError as exc:
        if from_driver(exc):  # a concurrent request created the same id between the check and the insert
            raise ConflictError(f"run {body.run_id!r} already exists") from None
        raise


@router.get("/{run_id}", response_model=RunOut, responses={**NOT_FOUND})
def get_run(run_id: RunIdPath, services: ServicesDep, _key: ReadKey) -> dict[str, Any]:
    """One run: its filter, seed, queue progress (pending/claimed/done) and recorded executions."""
    with services.read() as conn:
        return q.get_run(conn, run_id)


@router.get("/{run_id}/items", response_model=RunItemsPage, responses={**NOT_FOUND})
def run_items(run_id: RunIdPath, services: ServicesDep, _key: ReadKey, limit: LimitDep,
              cursor: CursorQuery = None) -> dict[str, Any]:
    """A training run's queue in claim order, with each item's state."""
    with services.read() as conn:
        return q.run_items(conn, run_id, limit=limit, cursor=cursor, cursors=services.cursors)


@router.get("/{run_id}/drift", response_model=RunDriftDetail)
def get_run_drift(run_id: RunIdPath, services: ServicesDep, _key: ReadKey, limit: LimitDep) -> dict[str, Any]:
    """Retokenization drift of the run's chat calls (recorded by the gateway): calls checked, calls drifted,
    the rate (null when none was checked) and the earliest drifted calls with where each first differed.
    A run id with no recorded calls reads all zeros."""
    with services.snapshot() as conn:
        return run_drift(conn, run_id, limit=limit)
