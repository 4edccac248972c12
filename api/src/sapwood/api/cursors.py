"""Opaque keyset-pagination cursors, signed by the server and bound to the listing they page.

A cursor is URL-safe base64 of ``mac(16 bytes) || JSON [scope, values...]`` where ``mac`` is
HMAC-SHA256 (truncated to 128 bits) under the server's secret (``SAPWOOD_API_CURSOR_SECRET``;
``sapwood serve`` generates one shared by its workers when unset). The scope names the listing
and the resource it belongs to (``calls:<execution_id>``, ``items:<run_id>``, ...), so a cursor
cannot be forged, edited, or replayed against another execution, run or listing. Values are
range-checked on the way in as well (int64 integers, finite floats, short strings), so even a
cursor signed under a leaked secret cannot make a query fail.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import math
import secrets
from typing import Any

from sapwood.platform.errors import ValidationError
from sapwood.platform.uuids import canonical_uuid

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAC_BYTES = 16
MAX_TEXT = 256
_INVALID = "invalid cursor; pass the next_cursor of a previous page of the same listing unchanged"


class Cursors:
    """Encoder/decoder of signed cursors under one secret (one per app; share it across workers)."""

    def __init__(self, secret: str | bytes | None = None) -> None:
        if secret is None or secret == "":
            secret = secrets.token_bytes(32)
        self._key = secret.encode() if isinstance(secret, str) else secret

    def _mac(self, payload: bytes) -> bytes:
        return hmac.new(self._key, payload, hashlib.sha256).digest()[:MAC_BYTES]

    def encode(self, scope: str, *values: Any) -> str:
        """Cursor for ``values`` of the listing ``scope``."""
        payload = json.dumps([scope, *values], separators=(",", ":")).encode()
        return base64.urlsafe_b64encode(self._mac(payload) + payload).decode().rstrip("=")

    def decode(self, cursor: str, scope: str, types: tuple[type, ...]) -> list[Any]:
        """Values of a cursor this server made for ``scope``; :class:`ValidationError` otherwise."""
        try:
            raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        except (binascii.Error, ValueError):
            raise ValidationError(_INVALID) from None
        mac, payload = raw[:MAC_BYTES], raw[MAC_BYTES:]
        if len(mac) != MAC_BYTES or not hmac.compare_digest(mac, self._mac(payload)):
            raise ValidationError(_INVALID)
        try:
            data = json.loads(payload)
        except (ValueError, UnicodeDecodeError):
            data = None
        if not isinstance(data, list) or len(data) != len(types) + 1 or data[0] != scope:
            raise ValidationError(_INVALID)
        values = data[1:]
        for value, typ in zip(values, types, strict=True):
            if not _in_range(value, typ):
                raise ValidationError(_INVALID)
        return values


def _in_range(value: Any, typ: type) -> bool:
    if isinstance(value, bool):
        return False
    if typ is int:
        return isinstance(value, int) and INT64_MIN <= value <= INT64_MAX
    if typ is float:
        return isinstance(value, int | float) and math.isfinite(value) and abs(value) < 1e300
    if typ is str:
        return isinstance(value, str) and len(value) <= MAX_TEXT
    return False


def check_uuid(value: str, what: str = "cursor") -> str:
    try:
        return canonical_uuid(value)
    except (ValueError, AttributeError, TypeError):
        raise ValidationError(f"invalid {what}") from None
