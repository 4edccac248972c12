"""The HTTP/1.1 protocol ``sapwood serve`` runs: uvicorn's httptools protocol with limits enforced while reading.

uvicorn's httptools protocol takes a request head of any size and any number of headers into the
event loop before the app can refuse it, never times out a connection that sends nothing or half
a request, and lets one client hold any number of connections. :class:`GuardedHttpToolsProtocol`
adds, per connection, as bytes arrive:

- request line + headers above ``max_header_bytes`` or more than ``max_header_count`` headers: 431
  and the connection is closed at once (the rest is never read);
- a request not completely received (head and body) within ``read_timeout_s`` of its first byte,
  or a new connection that sends nothing for that long: 408 and close;
- more than ``max_connections_per_client`` open connections from one address (per worker): 503
  and close.

Idle keep-alive connections are closed by uvicorn's ``timeout_keep_alive``.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from sapwood.api.config import ApiSettings
from sapwood.api.timing import RECEIVED


@dataclass(frozen=True)
class ConnectionLimits:
    """What one connection may send and hold (see the module docstring)."""

    max_header_bytes: int
    max_header_count: int
    read_timeout_s: float
    max_connections_per_client: int

    @classmethod
    def from_settings(cls, settings: ApiSettings) -> ConnectionLimits:
        return cls(settings.api_max_header_bytes, settings.api_max_header_count, settings.api_request_read_timeout_s,
                   settings.api_max_connections_per_client)


@functools.cache
def _settings_limits() -> ConnectionLimits:
    return ConnectionLimits.from_settings(ApiSettings())


def _plain_response(status: bytes, message: str) -> bytes:
    body = message.encode()
    return (b"HTTP/1.1 " + status + b"\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: "
            + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n" + body)


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with :class:`ConnectionLimits` (from ``SAPWOOD_API_*`` unless set)."""

    limits: ClassVar[ConnectionLimits | None] = None
    #: Open connections per client address in this worker process.
    open_per_client: ClassVar[Counter[str]] = Counter()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._limits = type(self).limits or _settings_limits()
        self._head_bytes = 0
        self._head_count = 0
        self._head_pending = True  # bytes received belong to a request head not yet complete
        self._raw_head = 0
        self._refused = False
        self._counted: str | None = None
        self._read_timer: asyncio.TimerHandle | None = None

    # -- connection ---------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        host = self.client[0] if self.client else None
        if host is not None:
            if self.open_per_client[host] >= self._limits.max_connections_per_client:
                self._refuse(b"503 Service Unavailable", f"more than {self._limits.max_connections_per_client} "
                             "open connections from this client (SAPWOOD_API_MAX_CONNECTIONS_PER_CLIENT)")
                return
            self.open_per_client[host] += 1
            self._counted = host
        self._arm_read_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_read_timer()
        if self._counted is not None:
            self.open_per_client[self._counted] -= 1
            if self.open_per_client[self._counted] <= 0:
                del self.open_per_client[self._counted]
            self._counted = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        """Feed the parser; a head still incomplete after this chunk counts all of it (httptools buffers
        a header until its line ends, so the callbacks alone would see a 64 MB header only at its end)."""
        if self._refused:
            return
        head_pending = self._head_pending
        super().data_received(data)
        if head_pending and self._head_pending and not self._refused:
            self._raw_head += len(data)
            if self._raw_head > self._limits.max_header_bytes:
                self._refuse_head()

    def send_400_response(self, msg: str) -> None:
        if not self._refused:  # a refusal already answered; the parser error it raised is not the client's
            super().send_400_response(msg)

    # -- parser callbacks -----------------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self._head_bytes = 0
        self._head_count = 0
        if self._read_timer is None:
            self._arm_read_timer()
        super().on_message_begin()
        self.scope[RECEIVED] = time.perf_counter()  # type: ignore[literal-required]  # the loop's backlog starts

    def on_url(self, url: bytes) -> None:
        self._count_head(len(url), 0)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_head(len(name) + len(value), 1)
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._head_pending = False
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._cancel_read_timer()
        self._head_pending = True
        self._raw_head = 0
        super().on_message_complete()

    # -- limits ---------------------------------------------------------------------------------------
    def _count_head(self, size: int, count: int) -> None:
        """Raise (stopping the parser) after answering 431 when the head grows past a limit."""
        self._head_bytes += size
        self._head_count += count
        limits = self._limits
        if self._head_bytes > limits.max_header_bytes or self._head_count > limits.max_header_count:
            self._refuse_head()
            raise _Refused

    def _refuse_head(self) -> None:
        limits = self._limits
        self._refuse(b"431 Request Header Fields Too Large",
                     f"request line and headers of more than {limits.max_header_bytes} bytes or "
                     f"{limits.max_header_count} headers (SAPWOOD_API_MAX_HEADER_BYTES, SAPWOOD_API_MAX_HEADER_COUNT)")

    def _arm_read_timer(self) -> None:
        self._cancel_read_timer()
        self._read_timer = self.loop.call_later(self._limits.read_timeout_s, self._read_timed_out)

    def _cancel_read_timer(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None

    def _read_timed_out(self) -> None:
        self._read_timer = None
        if self.cycle is not None and self.cycle.response_started:
            self.transport.close()  # the app answered before reading all of it: nothing more to say
            return
        self._refuse(b"408 Request Timeout", f"the request was not received within {self._limits.read_timeout_s} s "
                     "(SAPWOOD_API_REQUEST_READ_TIMEOUT_S)")

    def _refuse(self, status: bytes, message: str) -> None:
        self._refused = True
        self._cancel_read_timer()
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True
            self.cycle.message_event.set()
        if not self.transport.is_closing():
            self.transport.write(_plain_response(status, message))
            self.transport.close()


class _Refused(Exception):
    """Raised inside a parser callback to stop reading a refused request."""


def guarded_protocol(limits: ConnectionLimits) -> type[GuardedHttpToolsProtocol]:
    """A :class:`GuardedHttpToolsProtocol` with these limits (and its own per-client counts)."""
    return type("GuardedHttpToolsProtocol", (GuardedHttpToolsProtocol,),
                {"limits": limits, "open_per_client": Counter()})
