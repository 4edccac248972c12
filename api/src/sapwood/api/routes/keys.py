"""API key management (scope admin)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path

from sapwood.api import auth
from sapwood.api.deps import AdminKey, ServicesDep
from sapwood.api.routes import AUTH_ERRORS, CONFLICT, NOT_FOUND, TOO_LARGE
from sapwood.api.schemas import KeyCreate, KeyCreated, KeyList, KeyOut

router = APIRouter(prefix="/v1/keys", tags=["keys"], responses=AUTH_ERRORS)


@router.get("", response_model=KeyList)
def list_keys(services: ServicesDep, _key: AdminKey) -> dict[str, Any]:
    """Every key's id, name, scopes and state (never secrets)."""
    with services.read() as conn:
        return {"items": auth.list_keys(conn)}


@router.post("", response_model=KeyCreated, status_code=201, responses={**TOO_LARGE})
def create_key(body: KeyCreate, services: ServicesDep, _key: AdminKey) -> dict[str, Any]:
    """Issue a key; the response is the only time its secret is shown (only its SHA-256 is stored)."""
    with services.write() as conn:
        key, record = auth.create_key(conn, body.name, body.scopes)
    return {**record, "key": key}


@router.delete("/{key_id}", response_model=KeyOut, responses={**NOT_FOUND, **CONFLICT})
def revoke_key(key_id: Annotated[str, Path(pattern=r"^[0-9a-f]{16}$")], services: ServicesDep,
               _key: AdminKey) -> dict[str, Any]:
    """Revoke a key (at once on this worker, within SAPWOOD_API_KEY_CACHE_S on the others)."""
    with services.write() as conn:
        record = auth.revoke_key(conn, key_id)
    services.verifier.forget(key_id)
    return record
