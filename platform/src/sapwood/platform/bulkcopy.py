"""Bulk writes on PostgreSQL: COPY payloads built in Python, sent by a background writer.

Rows are formatted per column type into COPY's text format (spans into its binary format,
three fields of known types). A :class:`CopyWriter` sends each payload on the transaction's
connection from a background thread, in submission order, so the server stores one table
while Python formats the next; it waits for every COPY before the caller touches the
connection again.
"""

from __future__ import annotations

import contextlib
import json
import struct
import threading
from collections import deque
from types import TracebackType
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

#: Below this many rows a plain multi-row INSERT beats setting up a COPY.
COPY_MIN_ROWS = 32
#: Payloads below this size are sent inline: a thread hand-off would cost more than it hides.
THREAD_MIN_BYTES = 64 << 10

_NULL = "\\N"
_ESCAPES = str.maketrans({"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"})

# Binary COPY framing: signature, flags, header extension; per row a field count and
# length-prefixed fields; trailer -1.
_BINARY_HEADER = b"PGCOPY\n\xff\r\n\x00" + struct.pack("!ii", 0, 0)
_BINARY_TRAILER = struct.pack("!h", -1)
_SPAN_HEAD = struct.Struct("!hi")  # 3 fields, digest length
_SPAN_MID = struct.Struct("!ihi")  # int2 length (2), encoding, data length

Payload = tuple[str, bytes]


def _fmt_text(value: Any) -> str:
    return str(value).translate(_ESCAPES)


def _fmt_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":")).translate(_ESCAPES)


def _fmt_bool(value: Any) -> str:
    return "t" if value else "f"


def _fmt_int(value: Any) -> str:
    return str(int(value))


def _fmt_float(value: Any) -> str:
    return repr(float(value))


def _fmt_bytes(value: Any) -> str:
    return "\\\\x" + bytes(value).hex()


def field_formatter(type_: sa.types.TypeEngine[Any]) -> Any:
    """COPY text formatter of a non-NULL value of a column of SQLAlchemy type ``type_``."""
    if isinstance(type_, sa.JSON):
        return _fmt_json
    if isinstance(type_, sa.Boolean):
        return _fmt_bool
    if isinstance(type_, sa.Integer):
        return _fmt_int
    if isinstance(type_, sa.Float):
        return _fmt_float
    if isinstance(type_, sa.LargeBinary):
        return _fmt_bytes
    return _fmt_text  # strings and UUIDs (text form)


def text_payload(table: sa.Table, rows: list[dict[str, Any]]) -> Payload:
    """``COPY table (...) FROM STDIN`` and its text-format data for ``rows`` (dicts keyed by column)."""
    cols = [c for c in table.columns if c.name in rows[0]]
    fmts = [(c.name, field_formatter(c.type)) for c in cols]
    data = "".join(
        "\t".join(_NULL if (v := row[name]) is None else fmt(v) for name, fmt in fmts) + "\n" for row in rows
    )
    names = ", ".join(f'"{c.name}"' for c in cols)
    return f"COPY {table.name} ({names}) FROM STDIN", data.encode()


def spans_payload(rows: list[tuple[bytes, int, bytes]]) -> Payload:
    """Binary ``COPY spans`` of (digest, encoding, data) rows."""
    parts = [_BINARY_HEADER]
    for digest, enc, data in rows:
        parts += (_SPAN_HEAD.pack(3, len(digest)), digest, _SPAN_MID.pack(2, enc, len(data)), data)
    parts.append(_BINARY_TRAILER)
    return "COPY spans (digest, encoding, data) FROM STDIN (FORMAT BINARY)", b"".join(parts)


class CopyWriter:
    """Send COPY payloads on ``conn`` in order; background thread for large ones.

    Use as a context manager; leaving it waits for every payload and re-raises the first
    error (the transaction is then aborted and the caller's rollback discards everything).
    """

    def __init__(self, conn: Connection) -> None:
        self.raw = conn.connection.driver_connection
        self._queue: deque[Payload | None] = deque()
        self._ready = threading.Condition()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def submit(self, payload: Payload) -> None:
        if self._thread is None and len(payload[1]) < THREAD_MIN_BYTES:
            self._send(payload)
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="sapwood-copy", daemon=True)
            self._thread.start()
        with self._ready:
            self._queue.append(payload)
            self._ready.notify()

    def _send(self, payload: Payload) -> None:
        sql, data = payload
        with self.raw.cursor() as cur, cur.copy(sql) as copy:  # type: ignore[union-attr]
            copy.write(data)

    def _run(self) -> None:
        while True:
            with self._ready:
                while not self._queue:
                    self._ready.wait()
                item = self._queue.popleft()
            if item is None:
                return
            if self._error is None:
                try:
                    self._send(item)
                except BaseException as exc:  # re-raised by close() in the caller's thread
                    self._error = exc

    def close(self) -> None:
        """Wait for every submitted payload; raise the first error."""
        if self._thread is not None:
            with self._ready:
                self._queue.append(None)
                self._ready.notify()
            self._thread.join()
            self._thread = None
        if self._error is not None:
            raise self._error

    def __enter__(self) -> CopyWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc is None:
            self.close()
            return
        with contextlib.suppress(BaseException):  # the caller's exception wins
            self.close()


def bulk_insert(conn: Connection, table: sa.Table, rows: list[dict[str, Any]]) -> None:
    """Insert ``rows`` into ``table`` now: ``COPY`` on PostgreSQL for large batches, else ``INSERT``."""
    if not rows:
        return
    if conn.dialect.name != "postgresql" or len(rows) < COPY_MIN_ROWS:
        conn.execute(table.insert(), rows)
        return
    with CopyWriter(conn) as writer:
        writer.submit(text_payload(table, rows))


__all__ = ["COPY_MIN_ROWS", "CopyWriter", "bulk_insert", "field_formatter", "spans_payload", "text_payload"]
