"""Liveness and readiness (no API key needed)."""

from __future__ import annotations

import sqlalchemy as sa
from fastapi import APIRouter
from fastapi.responses import JSONResponse

from sapwood.api.deps import ServicesDep
from sapwood.api.schemas import ErrorOut, Health
from sapwood.platform.errors import StoreError

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health, responses={503: {"model": ErrorOut}})
def healthz(services: ServicesDep) -> Health | JSONResponse:
    """200 when the store answers a query, 503 otherwise."""
    try:
        with services.read() as conn:
            conn.execute(sa.text("SELECT 1"))
    except StoreError:
        return JSONResponse({"error": {"code": "store_unavailable", "message": "the store does not answer"}},
                            status_code=503)
    return Health(status="ok", database=services.store.dialect)
