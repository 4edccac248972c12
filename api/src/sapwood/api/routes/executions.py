"""Executions: listing with filters, trees (full and summarized), trajectories, calls and scores."""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request, Response
from sqlalchemy.engine import Connection
from starlette.concurrency import run_in_threadpool

from sapwood.api import writes
from sapwood.api.deps import CursorQuery, FilterDep, LimitDep, ReadKey, ServicesDep, WriteKey
from sapwood.api.idempotency import Answer, IdempotencyKey, idempotent, json_bytes
from sapwood.api.queries import audit as audit_q
from sapwood.api.queries import executions as q
from sapwood.api.queries import trees
from sapwood.api.routes import AUTH_ERRORS, CONFLICT, NOT_FOUND, TOO_LARGE, cached_json, dump, execution_version
from sapwood.api.schemas import (
    CallPage,
    ExecutionOut,
    ExecutionPage,
    ScoreCreate,
    ScoreOut,
    TrajectoryList,
    TreeOut,
    TreeSummaryOut,
)
from sapwood.platform.errors import ValidationError

router = APIRouter(prefix="/v1/executions", tags=["executions"], responses=AUTH_ERRORS)


@router.get("", response_model=ExecutionPage)
def list_executions(services: ServicesDep, _key: ReadKey, flt: FilterDep, limit: LimitDep,
                    cursor: CursorQuery = None,
                    order: Annotated[Literal["asc", "desc"], Query(description="by start time")] = "desc",
                    ) -> dict[str, Any]:
    """Executions matching the filters, newest first by default; keyset-paginated on (started_at, execution_id)."""
    with services.read() as conn:
        return q.list_executions(conn, flt, limit=limit, cursor=cursor, cursors=services.cursors, order=order)


@router.get("/{execution_id}", response_model=ExecutionOut, responses={**NOT_FOUND})
def get_execution(execution_id: uuid.UUID, services: ServicesDep, _key: ReadKey) -> dict[str, Any]:
    """One execution: task, status, reward, partial score, token counts, forks, segments."""
    with services.read() as conn:
        return trees.execution_out(trees.execution_row(conn, str(execution_id)))


@router.get("/{execution_id}/tree", response_model=TreeOut, responses={**NOT_FOUND})
async def get_tree(
    execution_id: uuid.UUID,
    request: Request,
    services: ServicesDep,
    _key: ReadKey,
    max_nodes: Annotated[int | None, Query(ge=1, le=10_000_000,
                                           description="at most this many nodes (default and maximum: "
                                                       "SAPWOOD_API_TREE_MAX_NODES)")] = None,
    max_level: Annotated[int | None, Query(ge=0, le=10_000_000, description="omit nodes below this level")] = None,
) -> Response:
    """The execution's whole tree: every node with role, token count, offsets, level, segment, fork and leaf
    flags, the producing call and policy version; plus segments, score revisions, fork points and leaves.

    Nodes come in creation order (parents first); with more nodes than the limits allow the response
    is a prefix and ``truncated`` is true — use ``/tree/summary`` for huge trees. Responses of an
    unchanged execution are cached and carry an ETag.
    """
    limit = services.settings.api_tree_max_nodes
    if max_nodes is not None and max_nodes > limit:
        raise ValidationError(f"max_nodes {max_nodes} is above the limit {limit} (SAPWOOD_API_TREE_MAX_NODES); "
                              "use /tree/summary or max_level for huge trees")
    eid = str(execution_id)
    version = await execution_version(services, eid)

    def build() -> bytes:
        with services.snapshot() as conn:
            ex = trees.execution_row(conn, eid)
            return dump(TreeOut, trees.full_tree(conn, ex, max_nodes=max_nodes or limit, max_level=max_level))

    return await cached_json(request, services, ("tree", eid, version, max_nodes or limit, max_level), build,
                             shared=version is not None)


@router.get("/{execution_id}/tree/summary", response_model=TreeSummaryOut, responses={**NOT_FOUND})
async def get_tree_summary(execution_id: uuid.UUID, request: Request, services: ServicesDep, _key: ReadKey) -> Response:
    """The tree with single-child chains collapsed: roots, segment roots, fork points, compacted summaries and
    leaves are kept; each edge between them reports the collapsed nodes, tokens by role and calls."""
    eid = str(execution_id)
    version = await execution_version(services, eid)

    def build() -> bytes:
        with services.snapshot() as conn:
            return dump(TreeSummaryOut, trees.tree_summary(conn, trees.execution_row(conn, eid)))

    return await cached_json(request, services, ("summary", eid, version), build,
                             shared=version is not None)


@router.get("/{execution_id}/trajectories", response_model=TrajectoryList, responses={**NOT_FOUND})
async def list_trajectories(execution_id: uuid.UUID, request: Request, services: ServicesDep,
                            _key: ReadKey) -> Response:
    """The execution's trajectories (one per leaf) with their length across segments and reward."""
    eid = str(execution_id)
    version = await execution_version(services, eid)

    def build() -> bytes:
        with services.snapshot() as conn:
            ex = trees.execution_row(conn, eid)
            return dump(TrajectoryList, {"execution_id": eid, "items": trees.trajectories(conn, ex)})

    return await cached_json(request, services, ("trajectories", eid, version), build,
                             shared=version is not None)


@router.get("/{execution_id}/calls", response_model=CallPage, responses={**NOT_FOUND})
def list_calls(execution_id: uuid.UUID, services: ServicesDep, _key: ReadKey, limit: LimitDep,
               cursor: CursorQuery = None) -> dict[str, Any]:
    """The execution's model calls in event order (audit one with /v1/calls/{call_id}/audit)."""
    with services.read() as conn:
        trees.execution_row(conn, str(execution_id))
        return audit_q.list_calls(conn, str(execution_id), limit=limit, cursor=cursor, cursors=services.cursors)


@router.get("/{execution_id}/scores", response_model=list[ScoreOut], responses={**NOT_FOUND})
def list_scores(execution_id: uuid.UUID, services: ServicesDep, _key: ReadKey) -> list[dict[str, Any]]:
    """Every partial-score revision of the execution, oldest first (the last one is current)."""
    with services.read() as conn:
        trees.execution_row(conn, str(execution_id))
        return trees.scores_of(conn, str(execution_id))


@router.post("/{execution_id}/scores", response_model=ScoreOut, status_code=201,
             responses={**NOT_FOUND, **CONFLICT, **TOO_LARGE})
async def add_score(execution_id: uuid.UUID, body: ScoreCreate, request: Request, services: ServicesDep,
                    key: WriteKey, idempotency_key: IdempotencyKey = None) -> Response:
    """Record a new partial-score revision (a ``partial_score`` event) of a finished execution.

    With an ``Idempotency-Key``, a retry gets the first answer instead of a second revision.
    """
    eid = str(execution_id)
    token = services.versions.token()
    seqs: list[int] = []

    def work(conn: Connection) -> Answer:
        out = writes.add_score(conn, eid, score=body.score, components=body.components, scorer=body.scorer,
                               note=body.note, expected_revision=body.expected_revision)
        seqs.append(trees.execution_version(conn, eid))  # the row is locked until the commit
        return Answer(201, json_bytes(ScoreOut, out))

    response, fresh = await run_in_threadpool(idempotent, services, key, idempotency_key, request, body, work)
    if fresh:  # this worker's next tree shows it, without waiting for the notify
        services.versions.written(eid, seqs[-1], token)
    return response
