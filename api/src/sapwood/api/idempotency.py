"""``Idempotency-Key`` on the API's POSTs: a retry gets the stored answer instead of doing the work again.

The answer (status and JSON body) is stored in the same transaction as the work, keyed by the
caller's key id and the header, with a SHA-256 of the request (method, path, canonical JSON of the
validated body). A retry with the same key and the same request replays it byte for byte; the
same key with a different request answers 409. Two concurrent first requests: the one whose insert
comes second fails on the table's primary key, its transaction (the work included) rolls back, and
it answers the stored answer of the other.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Header, Request, Response
from pydantic import BaseModel
from sqlalchemy.engine import Connection

from sapwood.api.auth import Principal
from sapwood.api.deps import Services
from sapwood.platform.errors import ConflictError
from sapwood.platform.storage.idempotency import StoredAnswer, get_answer, insert_answer

HEADER = "Idempotency-Key"
MAX_LENGTH = 128
PATTERN = r"^[A-Za-z0-9_.:-]+$"

IdempotencyKey = Annotated[str | None, Header(
    alias=HEADER, min_length=1, max_length=MAX_LENGTH, pattern=PATTERN,
    description=f"1-{MAX_LENGTH} characters of A-Z a-z 0-9 _ . : -; a retry with the same key and body "
                "gets the stored answer without the work being done again, a different body 409")]


@dataclass(frozen=True)
class Answer:
    """What a POST answers now, and what a retry with the same key will be answered (by default the same)."""

    status: int
    body: bytes
    replay: tuple[int, bytes] | None = None


def json_bytes(model: type[BaseModel], data: dict[str, Any]) -> bytes:
    """``data`` validated and serialized as ``model`` (what ``response_model`` would answer)."""
    return model.model_validate(data).model_dump_json().encode()


def request_digest(request: Request, body: BaseModel) -> bytes:
    """SHA-256 of the method, the path and the body as canonical JSON (key order and spacing do not count)."""
    canonical = json.dumps(body.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(f"{request.method} {request.url.path}\n{canonical}".encode()).digest()


def _response(status: int, body: bytes, *, replayed: bool) -> Response:
    headers = {"Idempotent-Replayed": "true"} if replayed else None
    return Response(content=body, status_code=status, media_type="application/json", headers=headers)


def _stored(stored: StoredAnswer, digest: bytes) -> Response:
    if stored.request_digest != digest:
        raise ConflictError(f"{HEADER} {stored.idempotency_key!r} was already used for a different request "
                            f"(first sent as {stored.route} with another body); use a new key for a new request")
    return _response(stored.status, stored.body, replayed=True)


def idempotent(services: Services, principal: Principal, key: str | None, request: Request, body: BaseModel,
               work: Callable[[Connection], Answer]) -> tuple[Response, bool]:
    """Run ``work`` in a write transaction once per ``key``; ``(response, whether work's answer is new)``.

    Without a key, ``work`` just runs. Blocking (call it from a worker thread).
    """
    if key is None:
        with services.write() as conn:
            answer = work(conn)
        return _response(answer.status, answer.body, replayed=False), True
    route = f"{request.method} {request.url.path}"[:300]
    digest = request_digest(request, body)
    try:
        with services.write() as conn:
            stored = get_answer(conn, principal.key_id, key)
            if stored is None:
                answer = work(conn)
                status, stored_body = answer.replay or (answer.status, answer.body)
                insert_answer(conn, StoredAnswer(principal=principal.key_id, idempotency_key=key, route=route,
                                                 request_digest=digest, status=status, body=stored_body,
                                                 created_at=time.time()))
    except ConflictError:
        # a concurrent request with the same key committed first (our insert, or the work's own, hit its row)
        with services.read() as conn:
            stored = get_answer(conn, principal.key_id, key)
        if stored is None:
            raise
    if stored is not None:
        return _stored(stored, digest), False
    return _response(answer.status, answer.body, replayed=False), True
