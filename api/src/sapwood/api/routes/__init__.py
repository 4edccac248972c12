"""HTTP routes, one module per resource; each route names the scope it needs (ReadKey, WriteKey, AdminKey)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Hashable
from typing import Any

from fastapi import Request, Response
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from sapwood.api.deps import Services
from sapwood.api.schemas import ErrorOut

AUTH_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorOut, "description": "malformed request: a body that is not UTF-8 JSON, a bad Content-Length"},
    401: {"model": ErrorOut, "description": "missing, malformed, unknown or revoked API key"},
    403: {"model": ErrorOut, "description": "the API key lacks the scope this route needs"},
    422: {"model": ErrorOut, "description": "invalid parameters or body"},
    431: {"model": ErrorOut, "description": "request headers larger than SAPWOOD_API_MAX_HEADER_BYTES"},
    503: {"model": ErrorOut, "description": "the store is unavailable or the query timed out"},
}
TOO_LARGE: dict[int | str, dict[str, Any]] = {
    413: {"model": ErrorOut, "description": "request body larger than SAPWOOD_API_MAX_BODY_BYTES"}}
NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"model": ErrorOut, "description": "no such resource"}}
CONFLICT: dict[int | str, dict[str, Any]] = {409: {"model": ErrorOut, "description": "conflicts with stored state"}}


def dump(model: type[BaseModel], data: dict[str, Any]) -> bytes:
    """Validate ``data`` against ``model`` and serialize it to JSON bytes."""
    return model.model_validate(data).model_dump_json().encode()


async def cached_json(request: Request, services: Services, key: Hashable, build: Callable[[], bytes]) -> Response:
    """Serve an immutable JSON body from the response cache (ETag / If-None-Match aware).

    A hit is answered on the event loop; only a miss runs ``build`` (blocking store reads) in the thread pool.
    """
    hit = services.cache.get(key)
    state = "hit"
    if hit is None:
        state = "miss"
        body = await run_in_threadpool(build)
        hit = (body, {"ETag": '"' + hashlib.blake2b(body, digest_size=16).hexdigest() + '"'})
        services.cache.put(key, hit)
    headers = {**hit[1], "X-Sapwood-Cache": state}
    if request.headers.get("if-none-match") == hit[1]["ETag"]:
        return Response(status_code=304, headers=headers)
    return Response(hit[0], media_type="application/json", headers=headers)
