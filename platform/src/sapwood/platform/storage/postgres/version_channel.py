"""Execution versions straight from PostgreSQL on asyncio psycopg connections: queries and the LISTEN channel.

The API's :class:`~sapwood.api.versions.VersionReader` keeps the version map and decides when to trust
it; this module owns everything psycopg: a few idle connections per event loop for ``last_seq``
queries, and one listening connection's life (LISTEN, heartbeat, notifications). Driver errors leave it
as :class:`~sapwood.platform.errors.StoreUnavailableError` (the connection failed) or
:class:`~sapwood.platform.errors.StoreError`. The channel, trigger and statements are migration 0003's
(:mod:`.execution_versions`).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
from sqlalchemy.engine import Engine

from sapwood.platform.errors import StoreError, StoreUnavailableError, UnknownParentError
from sapwood.platform.storage.postgres.execution_versions import CHANNEL, HAS_TRIGGER_SQL, LAST_SEQ_SQL, TRIGGER
from sapwood.platform.uuids import canonical_uuid

#: ``application_name`` of the listening connection (visible in ``pg_stat_activity``).
LISTENER_NAME = "sapwood-api-versions"


def parse_payload(payload: str) -> tuple[str, int] | None:
    """``"<execution_id> <last_seq>"`` → (execution_id, last_seq), None if malformed."""
    eid, _, seq = payload.partition(" ")
    try:
        return canonical_uuid(eid), int(seq)
    except ValueError:
        return None


class PostgresVersionChannel:
    """:class:`~sapwood.platform.storage.versions.VersionChannel` on PostgreSQL: ``last_seq`` queries on
    connections owned by the calling event loop, and the notification listener."""

    def __init__(self, engine: Engine, *, statement_timeout_ms: int, max_idle: int = 8,
                 heartbeat_s: float = 5.0) -> None:
        self.engine = engine
        self.statement_timeout_ms = statement_timeout_ms
        self.max_idle = max_idle
        self.heartbeat_s = heartbeat_s
        self._idle: list[psycopg.AsyncConnection[Any]] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    def connect_kwargs(self, **extra: Any) -> dict[str, Any]:
        """psycopg connection arguments from the engine's URL (query parameters such as a socket ``host`` kept)."""
        u = self.engine.url
        kw: dict[str, Any] = {k: v for k, v in u.query.items() if isinstance(v, str)}  # e.g. host=/run/postgresql
        kw.update(autocommit=True, options=f"-c statement_timeout={self.statement_timeout_ms}", **extra)
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

    async def last_seq(self, execution_id: str) -> int:
        """The execution's ``last_seq``; :class:`UnknownParentError` when there is no such execution."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # connections belong to the loop that opened them
            self.discard_all()
            self._loop = loop
        while True:
            reused = bool(self._idle)
            try:
                conn = self._idle.pop() if reused else await psycopg.AsyncConnection.connect(**self.connect_kwargs())
            except psycopg.Error as exc:
                raise StoreUnavailableError(f"database unavailable: {exc}") from exc
            try:
                cur = await conn.execute(LAST_SEQ_SQL, (uuid.UUID(execution_id),))
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

    async def listen(self, *, live: Callable[[], None], notified: Callable[[str, int], None],
                     down: Callable[[], None]) -> bool:
        """One listening connection's life: LISTEN, then ``live()``, then ``notified(execution_id, last_seq)`` per
        notification, with a heartbeat every ``heartbeat_s``; ``down()`` when it ends however it ends.

        Returns False when the trigger is missing (never went live, or went away); raises
        :class:`StoreUnavailableError` when the connection fails or stops answering.
        """
        try:
            conn = await psycopg.AsyncConnection.connect(**self.connect_kwargs(application_name=LISTENER_NAME))
        except (psycopg.Error, OSError) as exc:
            raise StoreUnavailableError(f"version listener: {exc}") from exc
        try:
            await conn.execute(f"LISTEN {CHANNEL}")
            if not await self._alive(conn):
                return False
            live()  # after LISTEN took effect: from here on no commit goes unnoticed
            while True:
                async for n in conn.notifies(timeout=self.heartbeat_s):
                    parsed = parse_payload(n.payload)
                    if parsed is not None:
                        notified(*parsed)
                if not await self._alive(conn):
                    return False
        except (psycopg.Error, OSError, TimeoutError) as exc:
            raise StoreUnavailableError(f"version listener: {exc}") from exc
        finally:
            down()
            await conn.close()

    async def _alive(self, conn: psycopg.AsyncConnection[Any]) -> bool:
        """Heartbeat: the connection answers (within the heartbeat period) and the trigger exists."""
        async with asyncio.timeout(self.heartbeat_s):
            cur = await conn.execute(HAS_TRIGGER_SQL, (TRIGGER,))
            row = await cur.fetchone()
        return bool(row and row[0])

    def discard_all(self) -> None:
        """Drop the idle query connections at once (synchronous close: the loop they belonged to may be gone)."""
        for conn in self._idle:
            conn.pgconn.finish()
        self._idle.clear()

    async def close(self) -> None:
        """Close the idle query connections."""
        idle, self._idle = self._idle, []
        for conn in idle:
            await conn.close()


__all__ = ["LISTENER_NAME", "PostgresVersionChannel", "parse_payload"]
