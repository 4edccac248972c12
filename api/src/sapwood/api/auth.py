"""API keys: ``<key_id>.<secret>``, stored as SHA-256 of the secret, compared in constant time.

Scopes are not hierarchical: a key holds exactly the scopes it lists. ``read`` queries,
``write`` creates runs and score revisions, ``admin`` manages keys. A key looked up from
the store is reused for ``ttl_s`` seconds per worker, so a revocation reaches every worker
within that time (at once on the worker that revoked it).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import Connection, Engine
from starlette.concurrency import run_in_threadpool

from sapwood.api.errors import AuthenticationError, PermissionDeniedError
from sapwood.platform.errors import ConflictError, UnknownParentError, ValidationError
from sapwood.platform.storage.backends import api_key_store
from sapwood.platform.storage.errors import translate_errors

SCOPES = ("read", "write", "admin")
_KEY_ID_RE = re.compile(r"^[0-9a-f]{16}$")
_SECRET_RE = re.compile(r"^[A-Za-z0-9_-]{20,128}$")
_DUMMY_HASH = hashlib.sha256(b"sapwood: no such key").digest()
MISSING_KEY = "missing API key: send 'Authorization: Bearer <key>' or 'X-API-Key: <key>'"


@dataclass(frozen=True)
class Principal:
    """The caller, as identified by its API key."""

    key_id: str
    name: str
    scopes: frozenset[str]


def parse_scopes(scopes: str | Iterable[str]) -> list[str]:
    """Validated, ordered scope list from ``"read write"`` or an iterable."""
    items = scopes.replace(",", " ").split() if isinstance(scopes, str) else list(scopes)
    unknown = sorted(set(items) - set(SCOPES))
    if unknown or not items:
        raise ValidationError(f"scopes must be a non-empty subset of {list(SCOPES)}, got {items!r}")
    return [s for s in SCOPES if s in items]


def hash_secret(secret: str) -> bytes:
    return hashlib.sha256(secret.encode()).digest()


def create_key(conn: Connection, name: str, scopes: str | Iterable[str]) -> tuple[str, dict[str, Any]]:
    """Store a new key; return the full key (shown once) and its public record."""
    if not name or len(name) > 128 or "\x00" in name:
        raise ValidationError("key name must be 1-128 characters")
    scope_list = parse_scopes(scopes)
    key_id = secrets.token_hex(8)
    secret = secrets.token_urlsafe(32)
    row = {"key_id": key_id, "name": name, "secret_hash": hash_secret(secret), "scopes": " ".join(scope_list),
           "created_at": time.time(), "revoked": False}
    api_key_store(conn).insert(conn, row)
    return f"{key_id}.{secret}", public_record(row)


def public_record(row: Any) -> dict[str, Any]:
    """A key's record without its hash."""
    m = dict(row)
    return {"key_id": m["key_id"], "name": m["name"], "scopes": m["scopes"].split(), "created_at": m["created_at"],
            "revoked": bool(m["revoked"])}


def list_keys(conn: Connection) -> list[dict[str, Any]]:
    return [public_record(r) for r in api_key_store(conn).all(conn)]


def revoke_key(conn: Connection, key_id: str) -> dict[str, Any]:
    """Mark ``key_id`` revoked; return its record. The last active ``admin`` key cannot be revoked
    (:class:`ConflictError`): create another admin key first, so key management stays reachable.

    The active keys are read ``FOR UPDATE`` on PostgreSQL (on SQLite the API's write transaction
    holds the database's write lock), so two admins revoking each other cannot both succeed.
    """
    keys = api_key_store(conn)
    admins = {kid for kid, scopes in keys.active_for_update(conn) if "admin" in scopes.split()}
    row = keys.get(conn, key_id)
    if row is None:
        raise UnknownParentError(f"API key {key_id!r} does not exist")
    if admins == {key_id}:
        raise ConflictError(f"API key {key_id} is the last active admin key; create another admin key "
                            "before revoking it")
    keys.revoke(conn, key_id)
    return {**public_record(row), "revoked": True}


def split_key(raw: str) -> tuple[str, str]:
    """``(key_id, secret)`` of a presented key, or :class:`AuthenticationError`."""
    key_id, sep, secret = raw.strip().partition(".")
    if not sep or not _KEY_ID_RE.match(key_id) or not _SECRET_RE.match(secret):
        raise AuthenticationError("malformed API key; expected '<key_id>.<secret>' as issued by `sapwood keys create`")
    return key_id, secret


@dataclass(frozen=True)
class KeyRecord:
    """What the verifier needs of a stored key."""

    secret_hash: bytes
    name: str
    scopes: frozenset[str]
    revoked: bool


class KeyVerifier:
    """Checks presented keys against ``api_keys``, caching lookups (also misses) for ``ttl_s`` seconds."""

    def __init__(self, engine: Engine, *, ttl_s: float = 5.0, max_entries: int = 10_000) -> None:
        self.engine = engine
        self.keys = api_key_store(engine)
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._cache: OrderedDict[str, tuple[float, KeyRecord | None]] = OrderedDict()
        self._lock = threading.Lock()

    def cached(self, key_id: str) -> tuple[bool, KeyRecord | None]:
        """``(found, record)``: whether a fresh lookup is cached; record None means no such key."""
        with self._lock:
            item = self._cache.get(key_id)
            if item is None or time.monotonic() - item[0] > self.ttl_s:
                return False, None
            self._cache.move_to_end(key_id)
            return True, item[1]

    def lookup(self, key_id: str) -> KeyRecord | None:
        """Read ``key_id`` from the store (blocking) and cache the result."""
        with translate_errors(), self.engine.begin() as conn:  # COMMIT keeps psycopg's prepared statements
            row = self.keys.get(conn, key_id)
        record = None if row is None else KeyRecord(bytes(row["secret_hash"]), row["name"],
                                                    frozenset(row["scopes"].split()), bool(row["revoked"]))
        with self._lock:
            self._cache[key_id] = (time.monotonic(), record)
            self._cache.move_to_end(key_id)
            while len(self._cache) > self.max_entries:
                self._cache.popitem(last=False)
        return record

    def forget(self, key_id: str) -> None:
        with self._lock:
            self._cache.pop(key_id, None)

    async def record_of(self, raw: str) -> tuple[str, str, KeyRecord | None]:
        """``(key_id, secret, stored record or None)`` of a presented key (401 when it is malformed)."""
        key_id, secret = split_key(raw)
        found, record = self.cached(key_id)
        if not found:
            record = await run_in_threadpool(self.lookup, key_id)
        return key_id, secret, record

    @staticmethod
    def authenticate(record: KeyRecord | None, secret: str) -> KeyRecord:
        """Constant-time secret comparison and the revocation check (401), any scope."""
        ok = hmac.compare_digest(hash_secret(secret), record.secret_hash if record else _DUMMY_HASH)
        if record is None or not ok or record.revoked:
            raise AuthenticationError("invalid or revoked API key")
        return record

    @classmethod
    def check(cls, record: KeyRecord | None, key_id: str, secret: str, scope: str) -> Principal:
        """:meth:`authenticate`, then the scope check (403)."""
        record = cls.authenticate(record, secret)
        if scope not in record.scopes:
            raise PermissionDeniedError(
                f"this API key has scopes {sorted(record.scopes)}; the request needs scope {scope!r}"
            )
        return Principal(key_id, record.name, record.scopes)
