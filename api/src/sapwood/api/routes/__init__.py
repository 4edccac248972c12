"""HTTP routes, one module per resource; each route names the scope it needs (ReadKey, WriteKey, AdminKey)."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Hashable
from typing import Any

import orjson
from fastapi import Request, Response
from pydantic import BaseModel

from sapwood.api import timing
from sapwood.api.cache import Cached
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


#: numpy arrays as JSON arrays; keys that are str subclasses (SQLAlchemy's column names) as plain keys.
_ORJSON = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS


def dump(model: type[BaseModel], data: dict[str, Any]) -> bytes:
    """JSON bytes of ``data``, the shape of ``model`` (which documents it in the OpenAPI schema).

    Written by orjson directly, numpy arrays (token ids int32, log-probs float32) included, without
    re-validating through pydantic: for a 128K-token audit that validation and the ``tolist()`` it
    needs cost more than rebuilding the context. The shapes are checked against the models by the
    schema tests (schemathesis' response-schema check on every route).
    """
    del model
    with timing.phase("json"):
        return orjson.dumps(data, option=_ORJSON)


def json_response(model: type[BaseModel], data: dict[str, Any]) -> Response:
    """A JSON response written by :func:`dump`."""
    return Response(dump(model, data), media_type="application/json")


async def execution_version(services: Services, execution_id: str) -> int | None:
    """The execution's version (``last_seq``) to key its cached answers by; None with the response cache
    off: nothing is kept, so nothing needs the version, and the query for it would be a round trip per
    request (a tenth of a cold tree's time)."""
    if services.cache.max_bytes == 0:
        return None
    return await services.versions.version(execution_id)


async def cached(services: Services, key: Hashable, build: Callable[[], Cached], *,
                 shared: bool = True) -> tuple[Cached, str]:
    """The cached entry for ``key`` and how it was got: ``hit``, ``miss`` (built here) or ``coalesced``.

    A miss runs ``build`` (blocking store reads) in the thread pool; concurrent misses on one key in
    this worker wait for that one build instead of each rebuilding the same answer. ``shared=False``
    (a key without the execution's version) builds afresh, merged with no other request: one that
    started before a write committed must not answer a request that came after it.
    """
    if not shared:
        return await timing.in_thread(build), "miss"
    hit = services.cache.get(key)
    if hit is not None:
        return hit, "hit"
    inflight = services.cache.inflight
    pending = inflight.get(key)
    if pending is not None:
        return await asyncio.shield(pending), "coalesced"
    future: asyncio.Future[Cached] = asyncio.get_running_loop().create_future()
    inflight[key] = future
    try:
        entry = await timing.in_thread(build)
    except BaseException as exc:
        future.set_exception(exc)
        future.exception()  # retrieved: no "never retrieved" warning when nobody else waited
        raise
    finally:
        del inflight[key]
    services.cache.put(key, entry)
    future.set_result(entry)
    return entry, "miss"


async def cached_json(request: Request, services: Services, key: Hashable, build: Callable[[], bytes], *,
                      shared: bool = True) -> Response:
    """Serve an immutable JSON body from the response cache (ETag / If-None-Match aware, see :func:`cached`)."""

    def entry() -> Cached:
        body = build()
        return body, {"ETag": '"' + hashlib.blake2b(body, digest_size=16).hexdigest() + '"'}

    hit, state = await cached(services, key, entry, shared=shared)
    headers = {**hit[1], "X-Sapwood-Cache": state}
    if request.headers.get("if-none-match") == hit[1]["ETag"]:
        return Response(status_code=304, headers=headers)
    return Response(hit[0], media_type="application/json", headers=headers)
