"""New spans streamed to PostgreSQL while their batch is still being planned.

Apply plans a batch event by event in Python, and PostgreSQL would sit idle meanwhile. A
:class:`SpanStream` keeps a binary ``COPY spans`` open on the batch's own connection and sends
each accepted event's new spans as soon as the event is planned, so the server stores them
while Python plans the next events. Everything stays in the caller's transaction: if the
batch fails, the spans go with it.

The connection can run no other statement while a COPY is open: :meth:`SpanStream.pause`
ends the current COPY (rows still buffered stay buffered) and the next flush opens another.
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from typing import Any

import numpy as np
from sqlalchemy.engine import Connection

from sapwood.platform.span_encoding import encode_span
from sapwood.platform.storage.postgres.bulkcopy import (
    BINARY_HEADER,
    BINARY_TRAILER,
    SPANS_COPY,
    abort_copy,
    frame_span,
    open_copy,
)

#: Bytes buffered before they go to the server: large enough that per-write driver overhead
#: is small, small enough that the server starts storing early in the batch.
FLUSH_BYTES = 1 << 16


class SpanStream:
    """An open ``COPY spans`` on ``conn`` fed one span at a time (PostgreSQL only)."""

    def __init__(self, conn: Connection, *, flush_bytes: int | None = None) -> None:
        self._conn = conn
        self._flush_bytes = FLUSH_BYTES if flush_bytes is None else flush_bytes
        self._parts: list[bytes] = []
        self._buffered = 0
        self._stack: ExitStack | None = None
        self._copy: Any = None
        #: Spans sent (or buffered) so far, and seconds spent narrowing, framing and sending them.
        self.rows = 0
        self.seconds = 0.0
        #: COPY statements opened (one, unless queries paused the stream).
        self.copies = 0

    def add(self, digest: bytes, canonical: np.ndarray, *, bits: int | None = None) -> None:
        """Queue one new span: ``canonical`` is its int32 ids [n] or float32 log-probs [n]; ``bits``
        the bitwise OR of its ids when known."""
        t0 = time.perf_counter()
        encoding, data = encode_span(canonical, bits=bits)
        self._buffered += frame_span(self._parts, digest, encoding, data)
        self.rows += 1
        if self._buffered >= self._flush_bytes:
            self._send()
        self.seconds += time.perf_counter() - t0

    def flush(self) -> None:
        """Send every buffered row to the server (the COPY stays open)."""
        t0 = time.perf_counter()
        self._send()
        self.seconds += time.perf_counter() - t0

    def pause(self) -> None:
        """End the open COPY, if any, so the connection can run a query; buffered rows wait."""
        if self._stack is not None:
            stack, self._stack = self._stack, None
            self._copy.write(BINARY_TRAILER)
            self._copy = None
            stack.close()

    def close(self) -> None:
        """Send what is buffered and end the COPY, waiting for the server to store every row."""
        self.flush()
        self.pause()

    def abort(self, exc: BaseException) -> None:
        """Abandon the open COPY because of ``exc`` (the transaction is then failed)."""
        if self._stack is not None:
            stack, self._stack = self._stack, None
            self._copy = None
            abort_copy(stack, exc)
        self._parts.clear()
        self._buffered = 0

    def _send(self) -> None:
        if not self._parts:
            return
        if self._stack is None:
            self._stack, self._copy = open_copy(self._conn, SPANS_COPY)
            self.copies += 1
            self._parts.insert(0, BINARY_HEADER)
        data = b"".join(self._parts)
        self._parts.clear()
        self._buffered = 0
        self._copy.write(data)


__all__ = ["FLUSH_BYTES", "SpanStream"]
