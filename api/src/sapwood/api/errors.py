"""Errors of the HTTP API and the handlers that turn every exception into ``{"error": {code, message}}``.

    SapwoodError (sapwood.platform.errors)
    ├── AuthenticationError   401: no key, malformed key, unknown or revoked key
    └── PermissionDeniedError 403: the key lacks the scope the route needs

Status mapping (first match wins): UnknownParentError → 404, ValidationError → 422,
ConflictError → 409, StoreUnavailableError → 503, any other error → 500 with a generic
message. Driver errors are translated with the platform's ``translate_errors`` first.
Stack traces are logged, never returned, and so is a driver's text (constraint names, key values):
a conflict raised by the database answers a generic 409 message.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy import exc as sa_exc
from starlette.exceptions import HTTPException as StarletteHTTPException

from sapwood.platform.errors import (
    ConflictError,
    SapwoodError,
    StoreUnavailableError,
    UnknownParentError,
    ValidationError,
)
from sapwood.platform.storage.errors import from_driver, translate_errors

log = logging.getLogger("sapwood.api")


class AuthenticationError(SapwoodError):
    """The request carries no valid API key."""


class PermissionDeniedError(SapwoodError):
    """The API key is valid but lacks the scope the route requires."""


#: (exception type, HTTP status, error code), most specific first.
ERROR_STATUS: tuple[tuple[type[SapwoodError], int, str], ...] = (
    (AuthenticationError, 401, "unauthorized"),
    (PermissionDeniedError, 403, "forbidden"),
    (UnknownParentError, 404, "not_found"),
    (ValidationError, 422, "invalid"),
    (ConflictError, 409, "conflict"),
    (StoreUnavailableError, 503, "store_unavailable"),
)

_HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    409: "conflict",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "invalid",
    429: "too_many_requests",
    503: "unavailable",
}


def error_body(code: str, message: str, **extra: Any) -> dict[str, Any]:
    """The JSON body of every error response."""
    return {"error": {"code": code, "message": message, **extra}}


def error_response(status: int, code: str, message: str, headers: dict[str, str] | None = None,
                   **extra: Any) -> JSONResponse:
    return JSONResponse(error_body(code, message, **extra), status_code=status, headers=headers)


DRIVER_CONFLICT = ("the request conflicts with a concurrent write (an id or revision was taken meanwhile); "
                   "read the current state and retry")


def sapwood_error_response(exc: SapwoodError) -> JSONResponse:
    for cls, status, code in ERROR_STATUS:
        if isinstance(exc, cls):
            if status == 503:
                return error_response(status, code, _unavailable_message(exc), headers={"Retry-After": "1"})
            if from_driver(exc):
                log.warning("driver error answered as %d: %s", status, exc)
                return error_response(status, code, DRIVER_CONFLICT if status == 409 else "invalid request")
            headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
            return error_response(status, code, str(exc), headers=headers)
    log.error("store or internal error", exc_info=exc)
    return error_response(500, "internal", "internal error; the server log has the details")


def _unavailable_message(exc: BaseException) -> str:
    if "pool exhausted" in str(exc):
        return "every database connection of this worker is busy; retry shortly"
    if "statement timeout" in str(exc):
        return "the query ran longer than the statement timeout; narrow the request (filters, limits) and retry"
    return "the store is unavailable; retry later"


def _translate(exc: sa_exc.SQLAlchemyError) -> SapwoodError:
    try:
        with translate_errors():
            raise exc
    except SapwoodError as translated:
        return translated
    raise AssertionError("translate_errors did not translate")  # pragma: no cover


async def _sapwood_handler(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, SapwoodError)
    if not isinstance(exc, AuthenticationError | PermissionDeniedError | ValidationError | ConflictError):
        log.warning("request failed: %s: %s", type(exc).__name__, exc)
    return sapwood_error_response(exc)


async def _sqlalchemy_handler(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, sa_exc.SQLAlchemyError)
    translated = _translate(exc)
    log.error("database error", exc_info=exc)
    return sapwood_error_response(translated)


#: Bounds of a 422's body: problems listed, path parts per problem, characters per text.
MAX_ERROR_DETAILS, MAX_LOC_PARTS, MAX_ERROR_TEXT = 20, 16, 300


def _short(text: object) -> str:
    value = str(text)
    return value if len(value) <= MAX_ERROR_TEXT else value[:MAX_ERROR_TEXT] + "…"


async def _validation_handler(_request: Request, exc: Exception) -> JSONResponse:
    """422 listing at most :data:`MAX_ERROR_DETAILS` problems, each bounded (a body of 100,000 bad
    items, or one nested 1,000 levels deep, answers a few KB, not megabytes)."""
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    details = []
    for err in errors[:MAX_ERROR_DETAILS]:
        loc = [str(p) for p in err.get("loc", ())]
        if len(loc) > MAX_LOC_PARTS:
            loc = [*loc[:MAX_LOC_PARTS // 2], "…", *loc[-(MAX_LOC_PARTS // 2):]]
        details.append({"loc": [_short(p) for p in loc], "msg": _short(err.get("msg", "")),
                        "type": _short(err.get("type", ""))})
    first = details[0] if details else {"loc": [], "msg": "invalid request"}
    where = ".".join(first["loc"])
    message = f"{where}: {first['msg']}" if where else str(first["msg"])
    if len(errors) > MAX_ERROR_DETAILS:
        message += f" (and {len(errors) - 1} more problems; the first {MAX_ERROR_DETAILS} are listed)"
    return error_response(422, "invalid_request", message, details=details)


async def _http_handler(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = _HTTP_CODES.get(exc.status_code, "error")
    message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
    return error_response(exc.status_code, code, message, headers=getattr(exc, "headers", None))


async def _unhandled_handler(_request: Request, exc: Exception) -> JSONResponse:
    log.error("unhandled error", exc_info=exc)
    return error_response(500, "internal", "internal error; the server log has the details")


def install_error_handlers(app: FastAPI) -> None:
    """Register the JSON error handlers on ``app``."""
    app.add_exception_handler(SapwoodError, _sapwood_handler)
    app.add_exception_handler(sa_exc.SQLAlchemyError, _sqlalchemy_handler)
    app.add_exception_handler(RequestValidationError, _validation_handler)
    app.add_exception_handler(StarletteHTTPException, _http_handler)
    app.add_exception_handler(Exception, _unhandled_handler)
