"""API key management (scope admin)."""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Path, Request, Response
from sqlalchemy.engine import Connection

from sapwood.api import auth
from sapwood.api.deps import AdminKey, ServicesDep
from sapwood.api.errors import error_body
from sapwood.api.idempotency import HEADER, Answer, IdempotencyKey, idempotent, json_bytes
from sapwood.api.routes import AUTH_ERRORS, CONFLICT, NOT_FOUND, TOO_LARGE
from sapwood.api.schemas import KeyCreate, KeyCreated, KeyList, KeyOut

router = APIRouter(prefix="/v1/keys", tags=["keys"], responses=AUTH_ERRORS)


@router.get("", response_model=KeyList)
def list_keys(services: ServicesDep, _key: AdminKey) -> dict[str, Any]:
    """Every key's id, name, scopes and state (never secrets)."""
    with services.read() as conn:
        return {"items": auth.list_keys(conn)}


@router.post("", response_model=KeyCreated, status_code=201, responses={**CONFLICT, **TOO_LARGE})
def create_key(body: KeyCreate, request: Request, services: ServicesDep, admin: AdminKey,
               idempotency_key: IdempotencyKey = None) -> Response:
    """Issue a key; the response is the only time its secret is shown (only its SHA-256 is stored).

    With an ``Idempotency-Key``, a retry issues no second key: since the secret is stored nowhere,
    it answers 409 naming the key issued first (revoke that one if its answer was lost).
    """

    def work(conn: Connection) -> Answer:
        key, record = auth.create_key(conn, body.name, body.scopes)
        refused = error_body("conflict", f"key {record['key_id']} was already issued for this {HEADER}; its secret "
                             f"is shown only once: revoke it (DELETE /v1/keys/{record['key_id']}) if its answer was "
                             "lost, and create another with a new key")
        return Answer(201, json_bytes(KeyCreated, {**record, "key": key}), replay=(409, json.dumps(refused).encode()))

    return idempotent(services, admin, idempotency_key, request, body, work)[0]


@router.delete("/{key_id}", response_model=KeyOut, responses={**NOT_FOUND, **CONFLICT})
def revoke_key(key_id: Annotated[str, Path(pattern=r"^[0-9a-f]{16}$")], services: ServicesDep,
               _key: AdminKey) -> dict[str, Any]:
    """Revoke a key (at once on this worker, within SAPWOOD_API_KEY_CACHE_S on the others)."""
    with services.write() as conn:
        record = auth.revoke_key(conn, key_id)
    services.verifier.forget(key_id)
    return record
