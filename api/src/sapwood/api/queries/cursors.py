"""Opaque keyset-pagination cursors: URL-safe base64 of a small JSON array, checked on the way in."""

from __future__ import annotations

import base64
import binascii
import json
import math
from typing import Any

from sapwood.platform.errors import ValidationError
from sapwood.platform.uuids import canonical_uuid


def encode_cursor(kind: str, *values: Any) -> str:
    raw = json.dumps([kind, *values], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str, kind: str, types: tuple[type, ...]) -> list[Any]:
    """Values of a cursor made by :func:`encode_cursor` for ``kind``; ValidationError if it is not one."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        data = json.loads(raw)
    except (binascii.Error, ValueError, UnicodeDecodeError):
        data = None
    if not isinstance(data, list) or len(data) != len(types) + 1 or data[0] != kind:
        raise ValidationError("invalid cursor; pass the next_cursor of a previous page of the same listing unchanged")
    values = data[1:]
    for value, typ in zip(values, types, strict=True):
        ok = isinstance(value, int | float) and not isinstance(value, bool) if typ is float else \
            isinstance(value, typ) and not isinstance(value, bool)
        if typ is float and ok and not math.isfinite(value):
            ok = False
        if not ok:
            raise ValidationError("invalid cursor; pass the next_cursor of a previous page unchanged")
    return values


def check_uuid(value: str, what: str = "cursor") -> str:
    try:
        return canonical_uuid(value)
    except (ValueError, AttributeError, TypeError):
        raise ValidationError(f"invalid {what}") from None
