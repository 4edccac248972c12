"""Bulk writes on PostgreSQL: COPY payloads built in Python with one formatter per column type.

Rows go in COPY's text format; spans (three fields of known types) in its binary format,
framed directly. Both are cheaper than the driver's per-value adaptation. Several payloads go
out with :func:`send_overlapped`: each is built while the server still stores the previous
one. (Sending from a background thread while the next payload is formatted was tried: under
the GIL the sender waits for the formatter and the total got slower.)
"""

from __future__ import annotations

import json
import struct
import time
from collections.abc import Callable, Iterable
from contextlib import ExitStack
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from sapwood.platform.tokens import DIGEST_SIZE

#: Below this many rows a plain multi-row INSERT beats setting up a COPY.
COPY_MIN_ROWS = 32

_NULL = "\\N"
_ESCAPES = str.maketrans({"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"})

# Binary COPY framing: signature, flags, header extension; per row a field count and
# length-prefixed fields; trailer -1.
BINARY_HEADER = b"PGCOPY\n\xff\r\n\x00" + struct.pack("!ii", 0, 0)
BINARY_TRAILER = struct.pack("!h", -1)
SPANS_COPY = "COPY spans (digest, encoding, data) FROM STDIN (FORMAT BINARY)"
_SPAN_HEAD = struct.Struct("!hi")  # 3 fields, digest length
_SPAN_MID = struct.Struct("!ihi")  # int2 length (2), encoding, data length
_SPAN_ROW_HEAD = struct.Struct(f"!hi{DIGEST_SIZE}sihi")  # both of the above around a digest of DIGEST_SIZE bytes

Payload = tuple[str, bytes]


def text_payload(table: sa.Table, rows: list[dict[str, Any]]) -> Payload:
    """``COPY table (...) FROM STDIN`` and its text-format data for ``rows`` (dicts keyed by column)."""
    cols = tuple(c.name for c in table.columns if c.name in rows[0])
    names = ", ".join(f'"{c}"' for c in cols)
    return f"COPY {table.name} ({names}) FROM STDIN", _row_formatter(table, cols)(rows).encode()


_FORMATTERS: dict[tuple[str, tuple[str, ...]], Callable[[list[dict[str, Any]]], str]] = {}


def _field_expr(type_: sa.types.TypeEngine[Any], v: str) -> str:
    """Python expression formatting the non-NULL value named ``v`` of a column of type ``type_``."""
    if isinstance(type_, sa.JSON):
        return f"_copy_json({v})"
    if isinstance(type_, sa.Boolean):
        return f"('t' if {v} else 'f')"
    if isinstance(type_, sa.Integer):
        return f"str(int({v}))"
    if isinstance(type_, sa.Float):
        return f"repr(float({v}))"
    if isinstance(type_, sa.LargeBinary):
        return f"_BYTEA + bytes({v}).hex()"
    if isinstance(type_, sa.Uuid):
        return f"str({v})"  # canonical UUID text never needs escaping
    return f"str({v}).translate(_ESC)"


def _row_formatter(table: sa.Table, cols: tuple[str, ...]) -> Callable[[list[dict[str, Any]]], str]:
    """A function formatting rows of ``cols`` as COPY text, generated once per (table, columns).

    The generated code runs one f-string per row instead of one formatter call per value; it is
    built only from the schema's column names and types.
    """
    key = (table.name, cols)
    fn = _FORMATTERS.get(key)
    if fn is None:
        fields = [
            "{_NULL if (v%d := r[%r]) is None else %s}" % (i, c, _field_expr(table.c[c].type, f"v{i}"))  # noqa: UP031
            for i, c in enumerate(cols)
        ]
        src = 'def _format(rows):\n    return "".join([f"""' + "\\t".join(fields) + '\\n""" for r in rows])\n'
        namespace: dict[str, Any] = {"_ESC": _ESCAPES, "_copy_json": _copy_json, "_NULL": _NULL, "_BYTEA": "\\\\x"}
        exec(compile(src, f"<COPY formatter of {table.name}>", "exec"), namespace)
        fn = _FORMATTERS[key] = namespace["_format"]
    return fn


_ORJSON_OPTIONS = orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY


def _copy_json(value: Any) -> str:
    """``value`` as JSON, escaped for COPY's text format.

    JSON text holds no raw tab, newline or carriage return (RFC 8259 escapes control characters),
    so only backslashes need escaping, and ``str.replace`` is far cheaper than ``str.translate``.
    """
    return _dumps(value).replace("\\", "\\\\")


def _dumps(value: Any) -> str:
    """Compact JSON text (orjson; the standard library for what orjson refuses, e.g. ints beyond 64 bits)."""
    try:
        return orjson.dumps(value, option=_ORJSON_OPTIONS).decode()
    except orjson.JSONEncodeError:
        return json.dumps(value, separators=(",", ":"))


def frame_span(parts: list[bytes], digest: bytes, encoding: int, data: bytes) -> int:
    """Append one binary-COPY ``spans`` row to ``parts``; return the bytes added."""
    if len(digest) == DIGEST_SIZE:  # the usual case: the whole row head in one pack
        parts += (_SPAN_ROW_HEAD.pack(3, DIGEST_SIZE, digest, 2, encoding, len(data)), data)
        return _SPAN_ROW_HEAD.size + len(data)
    parts += (_SPAN_HEAD.pack(3, len(digest)), digest, _SPAN_MID.pack(2, encoding, len(data)), data)
    return _SPAN_HEAD.size + len(digest) + _SPAN_MID.size + len(data)


def spans_payload(rows: list[tuple[bytes, int, bytes]]) -> Payload:
    """Binary ``COPY spans`` of (digest, encoding, data) rows."""
    parts = [BINARY_HEADER]
    for digest, enc, data in rows:
        frame_span(parts, digest, enc, data)
    parts.append(BINARY_TRAILER)
    return SPANS_COPY, b"".join(parts)


def send(conn: Connection, payload: Payload) -> None:
    """Run one COPY payload on the transaction's connection."""
    sql, data = payload
    stack, copy = open_copy(conn, sql)
    with stack:
        copy.write(data)


def open_copy(conn: Connection, sql: str) -> tuple[ExitStack, Any]:
    """Start ``sql`` (a ``COPY ... FROM STDIN``) on the transaction's connection.

    Returns the stack that ends it (``close()`` waits for the server's result) and the
    driver's copy object to ``write`` to.
    """
    raw = conn.connection.driver_connection
    stack = ExitStack()
    try:
        cursor = stack.enter_context(raw.cursor())  # type: ignore[union-attr]
        copy = stack.enter_context(cursor.copy(sql))
    except BaseException:
        stack.close()
        raise
    return stack, copy


def abort_copy(stack: ExitStack, exc: BaseException) -> None:
    """End an open COPY because of ``exc``: the server discards its rows and fails the transaction."""
    stack.__exit__(type(exc), exc, exc.__traceback__)


def send_overlapped(
    conn: Connection, builders: Iterable[Callable[[], Payload]], *, finish_previous: Callable[[], None] | None = None
) -> float:
    """Run the COPY payloads that ``builders`` make, one after another; return seconds spent building.

    Each payload is built while the server still stores the one before (its data is already
    written; only the end of its COPY is pending), so Python and PostgreSQL work at the same
    time. ``finish_previous`` ends a COPY the caller left open the same way.
    """
    building = 0.0
    pending: ExitStack | None = None
    try:
        for build in builders:
            t0 = time.perf_counter()
            sql, data = build()
            building += time.perf_counter() - t0
            if pending is not None:
                done, pending = pending, None
                done.close()
            elif finish_previous is not None:
                finish_previous()
            finish_previous = None
            pending, copy = open_copy(conn, sql)
            copy.write(data)
        if pending is not None:
            done, pending = pending, None
            done.close()
        elif finish_previous is not None:
            finish_previous()
    except BaseException as exc:
        if pending is not None:
            abort_copy(pending, exc)
        raise
    return building


__all__ = [
    "BINARY_HEADER",
    "BINARY_TRAILER",
    "COPY_MIN_ROWS",
    "SPANS_COPY",
    "abort_copy",
    "frame_span",
    "open_copy",
    "send",
    "send_overlapped",
    "spans_payload",
    "text_payload",
]
