"""An execution's version (``last_seq``) read without a thread hop, for cache validation on hot paths.

Cached trees are keyed by ``(execution_id, last_seq)``; checking the version is the only store access
of a cache hit. On PostgreSQL it runs on a few asyncio psycopg connections owned by the worker's
event loop (handing a request to the thread pool and back costs more than the query itself, and
under CPU contention the hand-off dominates tail latency); other backends use the thread pool.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import psycopg
from sqlalchemy.engine import Engine
from starlette.concurrency import run_in_threadpool

from sapwood.api.queries.trees import execution_version
from sapwood.platform.errors import StoreError, StoreUnavailableError, UnknownParentError

_QUERY = "SELECT last_seq FROM executions WHERE execution_id = %s"


class VersionReader:
    """``await reader.version(execution_id)`` → ``last_seq``; UnknownParentError when there is no such execution."""

    def __init__(self, engine: Engine, *, statement_timeout_ms: int, max_idle: int = 8) -> None:
        self.engine = engine
        self.max_idle = max_idle
        self.statement_timeout_ms = statement_timeout_ms
        self._idle: list[psycopg.AsyncConnection[Any]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self.native = engine.dialect.name == "postgresql" and engine.dialect.driver == "psycopg"

    def _connect_kwargs(self) -> dict[str, Any]:
        u = self.engine.url
        kw: dict[str, Any] = {k: v for k, v in u.query.items() if isinstance(v, str)}  # e.g. host=/run/postgresql
        kw.update(autocommit=True, options=f"-c statement_timeout={self.statement_timeout_ms}")
        if u.host:
            kw["host"] = u.host
        if u.port:
            kw["port"] = u.port
        if u.database:
            kw["dbname"] = u.database
        if u.username:
            kw["user"] = u.username
        if u.password:
            kw["password"] = u.password
        return kw

    def _sync_version(self, execution_id: str) -> int:
        with self.engine.connect() as conn:
            return execution_version(conn, execution_id)

    async def version(self, execution_id: str) -> int:
        if not self.native:
            return await run_in_threadpool(self._sync_version, execution_id)
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # connections belong to the loop that opened them
            self._discard_all()
            self._loop = loop
        while True:
            reused = bool(self._idle)
            try:
                conn = self._idle.pop() if reused else await psycopg.AsyncConnection.connect(**self._connect_kwargs())
            except psycopg.Error as exc:
                raise StoreUnavailableError(f"database unavailable: {exc}") from exc
            try:
                cur = await conn.execute(_QUERY, (uuid.UUID(execution_id),))
                row = await cur.fetchone()
                break
            except psycopg.Error as exc:
                await conn.close()
                if reused and conn.broken:  # went stale while idle (server restart): retry on a fresh one
                    continue
                if isinstance(exc, psycopg.OperationalError):
                    raise StoreUnavailableError(f"database unavailable: {exc}") from exc
                raise StoreError(f"database error: {exc}") from exc
        if len(self._idle) < self.max_idle:
            self._idle.append(conn)
        else:
            await conn.close()
        if row is None:
            raise UnknownParentError(f"execution {execution_id} does not exist")
        return int(row[0])

    def _discard_all(self) -> None:
        for conn in self._idle:
            conn.pgconn.finish()  # synchronous close; the loop they belonged to may be gone
        self._idle.clear()

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            await conn.close()
