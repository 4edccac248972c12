"""Bulk writes on PostgreSQL: COPY payloads built in Python with one formatter per column type.

Rows go in COPY's text format; spans (three fields of known types) in its binary format,
framed directly. Both are cheaper than the driver's per-value adaptation. (Sending from a
background thread while the next payload is formatted was tried: under the GIL the sender
waits for the formatter and the total got slower.)
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

#: Below this many rows a plain multi-row INSERT beats setting up a COPY.
COPY_MIN_ROWS = 32

_NULL = "\\N"
_ESCAPES = str.maketrans({"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"})

# Binary COPY framing: signature, flags, header extension; per row a field count and
# length-prefixed fields; trailer -1.
_BINARY_HEADER = b"PGCOPY\n\xff\r\n\x00" + struct.pack("!ii", 0, 0)
_BINARY_TRAILER = struct.pack("!h", -1)
_SPAN_HEAD = struct.Struct("!hi")  # 3 fields, digest length
_SPAN_MID = struct.Struct("!ihi")  # int2 length (2), encoding, data length

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
        return f"_dumps({v}).translate(_ESC)"
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
        namespace: dict[str, Any] = {"_ESC": _ESCAPES, "_dumps": _dumps, "_NULL": _NULL, "_BYTEA": "\\\\x"}
        exec(compile(src, f"<COPY formatter of {table.name}>", "exec"), namespace)
        fn = _FORMATTERS[key] = namespace["_format"]
    return fn


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def spans_payload(rows: list[tuple[bytes, int, bytes]]) -> Payload:
    """Binary ``COPY spans`` of (digest, encoding, data) rows."""
    parts = [_BINARY_HEADER]
    for digest, enc, data in rows:
        parts += (_SPAN_HEAD.pack(3, len(digest)), digest, _SPAN_MID.pack(2, enc, len(data)), data)
    parts.append(_BINARY_TRAILER)
    return "COPY spans (digest, encoding, data) FROM STDIN (FORMAT BINARY)", b"".join(parts)


def send(conn: Connection, payload: Payload) -> None:
    """Run one COPY payload on the transaction's connection."""
    sql, data = payload
    raw = conn.connection.driver_connection
    with raw.cursor() as cur, cur.copy(sql) as copy:  # type: ignore[union-attr]
        copy.write(data)


def bulk_insert(conn: Connection, table: sa.Table, rows: list[dict[str, Any]]) -> None:
    """Insert ``rows`` into ``table`` now: ``COPY`` on PostgreSQL for large batches, else ``INSERT``."""
    if not rows:
        return
    if conn.dialect.name != "postgresql" or len(rows) < COPY_MIN_ROWS:
        conn.execute(table.insert(), rows)
        return
    send(conn, text_payload(table, rows))


__all__ = ["COPY_MIN_ROWS", "bulk_insert", "send", "spans_payload", "text_payload"]
