"""JSON on the gateway's hot path: orjson (several times faster than ``json``), with the standard library's
reading and writing kept for what orjson refuses, so every body the gateway accepted before still passes.

orjson refuses ``NaN`` / ``Infinity`` literals (a server may write ``-Infinity`` for a log-prob) and
integers beyond 64 bits; those are read and written with :mod:`json`, as before. A float that is not
finite (only in a body that came in with such a literal) is written as ``null`` (orjson's rule; the
``JSONResponse`` used before refused it with a 500).
"""

from __future__ import annotations

import json
from typing import Any

import orjson
from fastapi.responses import JSONResponse


def loads(data: bytes | str) -> Any:
    """Parse one JSON document (:class:`ValueError` if it is not one)."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)


def dumps(value: Any) -> bytes:
    """``value`` as compact UTF-8 JSON (a float that is not finite as ``null``)."""
    try:
        return orjson.dumps(value)
    except TypeError:  # ints beyond 64 bits
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


class FastJSONResponse(JSONResponse):
    """A JSON response written with :func:`dumps`."""

    def render(self, content: Any) -> bytes:
        return dumps(content)


__all__ = ["FastJSONResponse", "dumps", "loads"]
