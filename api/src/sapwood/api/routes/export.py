"""Parquet export of executions (one row per trajectory or per node), streamed as a download."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from sapwood.api.deps import FilterDep, ReadKey, ServicesDep
from sapwood.api.export_pool import ExportResponse
from sapwood.api.queries.export import NODE_SCHEMA, TRAJECTORY_SCHEMA, ParquetExport, describe_schema
from sapwood.api.routes import AUTH_ERRORS
from sapwood.platform.errors import ValidationError

router = APIRouter(prefix="/v1", tags=["export"], responses=AUTH_ERRORS)
PARQUET = "application/vnd.apache.parquet"


@router.get(
    "/export.parquet",
    response_class=StreamingResponse,
    responses={200: {"description": "a Parquet file (zstd); see /v1/export/schema for its columns",
                     "content": {PARQUET: {"schema": {"type": "string", "format": "binary"}}}}},
)
async def export_parquet(
    services: ServicesDep,
    _key: ReadKey,
    flt: FilterDep,
    rows: Annotated[Literal["trajectory", "node"], Query(description="one row per trajectory or per node")]
    = "trajectory",
    limit: Annotated[int, Query(ge=1, le=10_000_000, description="at most this many executions (oldest first)")]
    = 1000,
) -> StreamingResponse:
    """Executions matching the filters as Parquet, readable by pyarrow, pandas, polars and DuckDB.

    Trajectory rows hold aligned per-token lists ``token_ids`` (int32), ``roles`` (int8: 0 prompt,
    1 observation, 2 action, 3 summary), ``logprobs`` (float32, null where not a model output) and
    ``policy_versions``; node rows hold each tree node once. The file streams row group by row group,
    in memory bounded by SAPWOOD_API_EXPORT_MEMORY_BYTES; 503 when SAPWOOD_API_EXPORT_CONCURRENCY exports run.
    """
    if limit > services.settings.api_max_export_executions:
        raise ValidationError(f"limit {limit} is above SAPWOOD_API_MAX_EXPORT_EXECUTIONS="
                              f"{services.settings.api_max_export_executions}")
    pool = services.exports
    pool.acquire()
    try:
        export = await run_in_threadpool(ParquetExport(pool.engine, flt, rows=rows, limit=limit,
                                                       memory_bytes=pool.memory_bytes).open)
    except BaseException:
        pool.release()
        raise
    return ExportResponse(iter(export), pool, media_type=PARQUET,
                          headers={"Content-Disposition": f'attachment; filename="sapwood-{rows}s.parquet"'})


@router.get("/export/schema")
async def export_schema(_key: ReadKey, rows: Literal["trajectory", "node"] = "trajectory") -> list[dict[str, str]]:
    """Columns of the export: name, Arrow type and description."""
    return describe_schema(TRAJECTORY_SCHEMA if rows == "trajectory" else NODE_SCHEMA)
