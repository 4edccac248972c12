"""Nodes: a node's tokens, the trajectory that ends at it, and the calls that saw it."""

from __future__ import annotations

import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Query, Response

from sapwood.api.deps import CursorQuery, LimitDep, ReadKey, ServicesDep
from sapwood.api.queries import audit as audit_q
from sapwood.api.queries import trees
from sapwood.api.routes import AUTH_ERRORS, NOT_FOUND, json_response
from sapwood.api.schemas import NodeCallsOut, NodeDetail, TrajectoryOut
from sapwood.api.tokenizer import per_token_text
from sapwood.platform.errors import ValidationError

router = APIRouter(prefix="/v1/nodes", tags=["nodes"], responses=AUTH_ERRORS)
Offset = Annotated[int, Query(ge=0, le=2**40, description="first token (past the end: an empty page)")]
TokenLimit = Annotated[int, Query(ge=1, le=1_000_000, description="tokens (at most SAPWOOD_API_MAX_TOKEN_PAGE)")]


def _check_limit(limit: int, maximum: int) -> None:
    if limit > maximum:
        raise ValidationError(f"limit {limit} is above the largest token page {maximum} (SAPWOOD_API_MAX_TOKEN_PAGE)")


@router.get("/{node_id}", response_model=NodeDetail, responses={**NOT_FOUND})
def get_node(node_id: uuid.UUID, services: ServicesDep, _key: ReadKey, offset: Offset = 0,
             limit: TokenLimit = 8192) -> Response:
    """One node with its tokens (and rollout log-probs for actions and summaries) in ``[offset, offset+limit)``."""
    _check_limit(limit, services.settings.api_max_token_page)
    with services.read() as conn:
        out, ids = trees.node_detail(conn, str(node_id), offset=offset, limit=limit)
        tokenizer = services.tokenizer_of(conn, str(out["execution_id"]))
    if tokenizer is not None:
        out["text"] = tokenizer.decode(ids.tolist())
        out["token_texts"] = per_token_text(tokenizer.decode, ids.tolist())
    return json_response(NodeDetail, out)


@router.get("/{node_id}/trajectory", response_model=TrajectoryOut, responses={**NOT_FOUND})
def get_trajectory(node_id: uuid.UUID, services: ServicesDep, _key: ReadKey, offset: Offset = 0,
                   limit: TokenLimit = 8192) -> Response:
    """The logical trajectory ending at this node (usually a leaf): the root-to-leaf path across compaction
    segments, its segments, and token ids with roles and rollout log-probs for ``[offset, offset+limit)``."""
    _check_limit(limit, services.settings.api_max_token_page)
    with services.read() as conn:
        out = trees.trajectory(conn, str(node_id), offset=offset, limit=limit, paths=services.paths)
    return json_response(TrajectoryOut, out)


@router.get("/{node_id}/calls", response_model=NodeCallsOut, responses={**NOT_FOUND})
def calls_seeing_node(node_id: uuid.UUID, services: ServicesDep, _key: ReadKey, limit: LimitDep,
                      cursor: CursorQuery = None) -> dict[str, Any]:
    """Reverse audit: the model calls whose exact input contained this node, in event order."""
    with services.read() as conn:
        return audit_q.calls_seeing(conn, str(node_id), limit=limit, cursor=cursor, cursors=services.cursors)
