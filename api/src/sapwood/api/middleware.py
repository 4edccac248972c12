"""ASGI middleware: reject request bodies larger than the configured limit with 413."""

from __future__ import annotations

import json
from typing import Any

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sapwood.api.errors import error_body


class BodySizeLimitMiddleware:
    """413 for a declared ``Content-Length`` over ``max_bytes``, or a streamed body that grows past it."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is None and _has_header(scope, b"content-length"):
            await _reply(send, 400, "bad_request", "Content-Length must be a non-negative integer")
            return
        if declared is not None and declared > self.max_bytes:
            await _reply(send, 413, "payload_too_large", self._message())
            return
        received = 0
        limit = self.max_bytes
        message = self._message()

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

    def _message(self) -> str:
        return f"request body larger than {self.max_bytes} bytes (SAPWOOD_API_MAX_BODY_BYTES)"


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


async def _reply(send: Send, status: int, code: str, message: str) -> None:
    body: Any = json.dumps(error_body(code, message)).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})
