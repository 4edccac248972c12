"""ASGI middleware: the API key before the body (401), body and header size limits (413, 431), path-only
redirects, complete ``Allow`` headers."""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from typing import Any
from urllib.parse import urlsplit

from starlette.exceptions import HTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sapwood.api.auth import MISSING_KEY, KeyVerifier
from sapwood.api.errors import AuthenticationError, error_body

#: Bodies of the routes that take one, at most (bytes; the server-wide limit applies too). Each is the
#: largest valid body with room for JSON escapes (``\\uXXXX`` is 6 bytes a character): a run's 64 KB
#: config and 2,000-character description; a score's 100 components and 4,000-character note; a key's name.
ROUTE_BODY_LIMITS: tuple[tuple[str, re.Pattern[str], int], ...] = (
    ("POST", re.compile(r"^/v1/runs/?$"), 512 * 1024),
    ("POST", re.compile(r"^/v1/executions/[^/]+/scores/?$"), 256 * 1024),
    ("POST", re.compile(r"^/v1/keys/?$"), 16 * 1024),
)


class BodySizeLimitMiddleware:
    """413 for a declared ``Content-Length`` over the route's limit, or a streamed body that grows past it.

    The limit is ``max_bytes`` (``SAPWOOD_API_MAX_BODY_BYTES``), or the route's own one in
    :data:`ROUTE_BODY_LIMITS` when that is lower.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def limit_for(self, method: str, path: str) -> tuple[int, str]:
        """``(bytes, what sets it)`` for a request."""
        for route_method, pattern, limit in ROUTE_BODY_LIMITS:
            if method == route_method and pattern.match(path) and limit < self.max_bytes:
                return limit, f"{method} {path}'s limit"
        return self.max_bytes, "SAPWOOD_API_MAX_BODY_BYTES"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is None and _has_header(scope, b"content-length"):
            await _reply(send, 400, "bad_request", "Content-Length must be a non-negative integer")
            return
        limit, source = self.limit_for(scope["method"], scope["path"])
        message = f"request body larger than {limit} bytes ({source})"
        if declared is not None and declared > limit:
            await _reply(send, 413, "payload_too_large", message)
            return
        received = 0

        async def limited() -> Message:
            nonlocal received
            msg = await receive()
            if msg["type"] == "http.request":
                received += len(msg.get("body", b""))
                if received > limit:
                    # an HTTPException passes through FastAPI's body parsing unchanged → 413 by the handler
                    raise HTTPException(413, message)
            return msg

        await self.app(scope, limited, send)


def _has_header(scope: Scope, name: bytes) -> bool:
    return any(k.lower() == name for k, _ in scope.get("headers", ()))


def _content_length(scope: Scope) -> int | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == b"content-length":
            try:
                n = int(value)
            except ValueError:
                return None
            return n if n >= 0 else None
    return None


async def _reply(send: Send, status: int, code: str, message: str,
                 headers: list[tuple[bytes, bytes]] | None = None) -> None:
    body: Any = json.dumps(error_body(code, message)).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close"), *(headers or [])]})
    await send({"type": "http.response.body", "body": body})


#: Methods whose requests may carry a body: their key is checked before any of it is read.
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class KeyBeforeBodyMiddleware:
    """401 for a request to ``/v1/`` that may carry a body and has no valid API key, before the body is read.

    FastAPI reads and parses a route's body before its dependencies run, so without this an
    unauthenticated malformed body answered 422 (and was parsed at all). The scope (403) is still
    checked by the route's dependency; the key lookup is cached, so the route's check costs no query.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] in _BODY_METHODS and scope["path"].startswith("/v1/"):
            raw = _presented_key(scope)
            try:
                if not raw:
                    raise AuthenticationError(MISSING_KEY)
                verifier: KeyVerifier = scope["app"].state.sapwood.verifier
                _, secret, record = await verifier.record_of(raw)
                verifier.authenticate(record, secret)
            except AuthenticationError as exc:
                await _reply(send, 401, "unauthorized", str(exc), [(b"www-authenticate", b"Bearer")])
                return
        await self.app(scope, receive, send)


def _presented_key(scope: Scope) -> str | None:
    """The key of ``Authorization: Bearer <key>`` or ``X-API-Key: <key>`` (the bearer one first)."""
    found: str | None = None
    for key, value in scope.get("headers", ()):
        name = key.lower()
        if name == b"authorization":
            scheme, _, credentials = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer" and credentials.strip():
                return credentials.strip()
        elif name == b"x-api-key" and found is None:
            found = value.decode("latin-1")
    return found


class HeaderLimitMiddleware:
    """431 when the request's headers (names and values together) exceed ``max_bytes``.

    uvicorn's default HTTP parser (httptools) accepts headers of any size; this bounds what
    reaches the routes (and ``sapwood serve`` also caps h11's incomplete-event buffer).
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            size = sum(len(k) + len(v) for k, v in scope.get("headers", ()))
            if size > self.max_bytes:
                await _reply(send, 431, "headers_too_large", f"request headers of {size} bytes, at most "
                             f"{self.max_bytes} (SAPWOOD_API_MAX_HEADER_BYTES)")
                return
        await self.app(scope, receive, send)


class ResponseStartRewriter(ABC):
    """Base of middleware that edits the status line's headers of HTTP responses (``rewrite``)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    @abstractmethod
    def rewrite(self, scope: Scope, message: Message) -> None:
        """Edit the ``http.response.start`` ``message`` of the request ``scope`` in place."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def edited(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.rewrite(scope, message)
            await send(message)

        await self.app(scope, receive, edited)


class RelativeRedirectMiddleware(ResponseStartRewriter):
    """Rewrite absolute ``Location`` headers of the server's own redirects (trailing slash, ``/ui``)
    to path-only ones: Starlette builds them from the request's ``Host`` header, which a client
    (or anything between it and the server) controls."""

    def rewrite(self, scope: Scope, message: Message) -> None:
        if 300 <= message["status"] < 400:
            message["headers"] = [(k, _path_only(v) if k.lower() == b"location" else v)
                                  for k, v in message.get("headers", ())]


def _path_only(location: bytes) -> bytes:
    parts = urlsplit(location.decode("latin-1"))
    path = "/" + parts.path.lstrip("/")  # never "//host": that would be protocol-relative
    return (path + ("?" + parts.query if parts.query else "")).encode("latin-1")


class AllowHeaderMiddleware(ResponseStartRewriter):
    """A 405 lists in ``Allow`` every method of every route on that path (Starlette names only the first
    route it tried, e.g. ``GET`` for ``/v1/runs`` although ``POST`` is served there too)."""

    def rewrite(self, scope: Scope, message: Message) -> None:
        if message["status"] == 405:
            methods = _allowed_methods(scope)
            if methods:
                headers = [(k, v) for k, v in message.get("headers", ()) if k.lower() != b"allow"]
                message["headers"] = [*headers, (b"allow", ", ".join(methods).encode())]


def _leaf_routes(routes: Any) -> Any:
    """Every endpoint route, also those inside routers that FastAPI includes lazily."""
    for route in routes:
        inner = getattr(route, "original_router", None)
        if inner is not None:
            yield from _leaf_routes(inner.routes)
        else:
            yield route


def _allowed_methods(scope: Scope) -> list[str]:
    router = getattr(scope.get("app"), "router", None)
    methods: set[str] = set()
    for route in _leaf_routes(getattr(router, "routes", ())):
        route_methods = getattr(route, "methods", None)
        if not route_methods:
            continue
        match, _ = route.matches({**scope, "method": next(iter(route_methods))})
        if match == Match.FULL:
            methods |= set(route_methods)
    return sorted(methods)
