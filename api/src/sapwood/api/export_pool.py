"""Exports' own resources: a connection pool, a cap on concurrent exports, a send timeout.

An export is long and reads much; on the request pool a few dozen of them (or clients that stop
reading) took every connection, so that ``/healthz`` and other routes failed. Exports therefore
read through their own engine (``api_export_pool_size`` connections, no overflow, statement and
idle-in-transaction timeouts), at most ``api_export_concurrency`` run at once per worker (one more
gets 503 with Retry-After), and a client that has not taken a chunk within ``api_export_send_timeout_s``
is dropped, which frees its slot (a connection is only held while an execution is read).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import anyio
from fastapi.responses import StreamingResponse
from sqlalchemy.engine import Engine
from starlette.types import Message, Send

from sapwood.api.config import ApiSettings
from sapwood.platform.errors import StoreUnavailableError
from sapwood.platform.store import Store, make_engine


@dataclass
class ExportPool:
    """The engine exports read through and the slots of running exports."""

    engine: Engine
    concurrency: int
    memory_bytes: int
    send_timeout_s: float
    _running: int = field(default=0, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)

    def acquire(self) -> None:
        """Take a slot, or :class:`StoreUnavailableError` (503) when all are taken."""
        with self._lock:
            if self._running >= self.concurrency:
                raise StoreUnavailableError(
                    f"{self.concurrency} exports are running (SAPWOOD_API_EXPORT_CONCURRENCY); retry later"
                )
            self._running += 1

    def release(self) -> None:
        with self._lock:
            self._running -= 1

    @property
    def running(self) -> int:
        return self._running

    def close(self) -> None:
        self.engine.dispose()


def open_export_pool(settings: ApiSettings, store: Store) -> ExportPool:
    """An engine on ``store``'s database with the export limits of ``settings``."""
    url = store.engine.url.render_as_string(hide_password=False)
    engine = make_engine(
        url,
        statement_timeout_ms=settings.api_export_statement_timeout_ms,
        idle_in_transaction_timeout_ms=int(settings.api_export_idle_timeout_s * 1000),
        pool_size=settings.api_export_pool_size,
        max_overflow=0,
        pool_timeout=settings.api_db_pool_timeout_s,
    )
    return ExportPool(
        engine,
        concurrency=settings.api_export_concurrency,
        memory_bytes=settings.api_export_memory_bytes,
        send_timeout_s=settings.api_export_send_timeout_s,
    )


class ExportResponse(StreamingResponse):
    """A streamed export that holds one slot of ``pool`` until it ends, and gives up on a client that
    does not take a chunk within the pool's send timeout (the connection is then closed)."""

    def __init__(self, chunks: Iterator[bytes], pool: ExportPool, **kw: Any) -> None:
        super().__init__(chunks, **kw)
        self.pool = pool

    async def stream_response(self, send: Send) -> None:
        async def timed_send(message: Message) -> None:
            with anyio.fail_after(self.pool.send_timeout_s):
                await send(message)

        try:
            await super().stream_response(timed_send)
        except TimeoutError:
            return  # the response is incomplete: the server closes the connection
        finally:
            self.pool.release()
