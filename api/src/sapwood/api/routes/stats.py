"""Store statistics: tokens, unique tokens, dedup ratios, ingest lag."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from sapwood.api.deps import ReadKey, ServicesDep
from sapwood.api.queries.drift import drift_table
from sapwood.api.queries.stats import store_stats
from sapwood.api.routes import AUTH_ERRORS
from sapwood.api.schemas import DriftTable, StatsOut

router = APIRouter(prefix="/v1", tags=["stats"], responses=AUTH_ERRORS)


@router.get("/stats", response_model=StatsOut)
def stats(services: ServicesDep, _key: ReadKey) -> dict[str, Any]:
    """Counts of events, executions, calls and nodes; naive vs tree vs unique tokens and the dedup ratios;
    ingest lag (Kafka log-end offset − offset committed by ingest) when Kafka is configured and reachable,
    else null with ``ingest_lag_reason``."""
    out = store_stats(services.store)
    with services.read() as conn:
        out.update(services.lag.read(conn))
    return out


@router.get("/drift", response_model=DriftTable)
def drift(services: ServicesDep, _key: ReadKey) -> dict[str, Any]:
    """The run-level retokenization drift table: every run with at least one chat call checked (by the
    gateway), with calls checked, calls drifted, the rate and the smallest position where a call drifted."""
    with services.read() as conn:
        return drift_table(conn)
