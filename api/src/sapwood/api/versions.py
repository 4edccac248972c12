"""An execution's version (``last_seq``) for cache validation on hot paths, pushed by PostgreSQL.

Cached trees are keyed by ``(execution_id, last_seq)``; knowing the version is the only store access
of a cache hit. On PostgreSQL each worker keeps the versions it knows in memory, kept current by
notifications: migration 0003 adds a trigger that sends ``pg_notify('sapwood_execution_versions',
'<execution_id> <last_seq>')`` for every insert of an execution and every update of its
``last_seq``, and a background task on the worker's event loop LISTENs on that channel. A cache
hit then needs no database round trip at all (under CPU contention the round trip made the tail).

What a reader may see, and why it is never an older version than the store had when the worker
last heard from it:

* A write committed by any writer — ingest, an in-process ``Store.apply``, a score revision
  through another API worker — reaches every worker's map within the notification delay
  (PostgreSQL delivers notifications at commit, in commit order; typically well under a
  millisecond, longer only while the worker's event loop is busy). Within that delay a request
  may still be answered with the previous version's tree, as with any read that raced the write.
* A score revision through this worker's API puts the new version into the map right after its
  commit, so a client that revised a score reads its own write from the same worker.
* ``last_seq`` only grows, so every update is ``map[e] = max(map[e], seq)``: a late or
  duplicate notification, or a query answer older than a notification, can't move it back.
* The map is used only while the listener is connected (and only from the event loop it runs
  on). Every connect, disconnect and clear of the map bumps an epoch; on disconnect the map is
  dropped and versions are queried (as without push) until the listener has reconnected (with
  backoff) and LISTENs again. A heartbeat every few seconds proves the connection alive and the
  trigger present (without the trigger — a database not yet migrated to 0003 — push stays off).
* On a map miss the version is queried; the answer goes into the map only when the listener was
  already listening before the query started and the epoch did not change until it returned
  (otherwise a notification for a write newer than the query's snapshot might have been missed).
* The map holds at most ``max_entries`` executions (default 200,000, ~30 MB); when full it is
  cleared (an epoch bump).

Queries run on a few asyncio psycopg connections owned by the worker's event loop (handing a
request to the thread pool and back costs more than the query itself); other backends use the
thread pool and never push.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from typing import Any

import psycopg
from sqlalchemy.engine import Engine
from starlette.concurrency import run_in_threadpool

from sapwood.api.queries.trees import execution_version
from sapwood.platform.errors import StoreError, StoreUnavailableError, UnknownParentError
from sapwood.platform.storage.postgres.execution_versions import CHANNEL as CHANNEL  # re-exported
from sapwood.platform.storage.postgres.execution_versions import HAS_TRIGGER_SQL, LAST_SEQ_SQL, native_async_postgres
from sapwood.platform.storage.postgres.execution_versions import TRIGGER as TRIGGER  # re-exported
from sapwood.platform.uuids import canonical_uuid

log = logging.getLogger(__name__)

#: ``application_name`` of the listening connection (visible in ``pg_stat_activity``).
LISTENER_NAME = "sapwood-api-versions"


class VersionMap:
    """Execution id → last known ``last_seq``, usable only while ``live`` (the listener is connected).

    ``token()`` before a query and ``learn(..., token)`` after it implement the epoch rule; the
    listener calls ``connected()``, ``notified()`` and ``disconnected()``. Not thread-safe: used
    from one event loop only.
    """

    def __init__(self, max_entries: int = 200_000) -> None:
        self.max_entries = max_entries
        self.epoch = 0
        self.live = False
        self._seqs: dict[str, int] = {}

    def get(self, execution_id: str) -> int | None:
        return self._seqs.get(execution_id) if self.live else None

    def token(self) -> int | None:
        """The epoch when live, else None: pass it to ``learn`` once the answer is known."""
        return self.epoch if self.live else None

    def learn(self, execution_id: str, seq: int, token: int | None) -> None:
        """Remember a version read (or written) since ``token()`` returned ``token``, if no notification can
        have been missed in between."""
        if token is not None and self.live and token == self.epoch:
            self._raise(execution_id, seq)

    def notified(self, execution_id: str, seq: int) -> None:
        if self.live:
            self._raise(execution_id, seq)

    def connected(self) -> None:
        self._reset(live=True)

    def disconnected(self) -> None:
        self._reset(live=False)

    def _reset(self, *, live: bool) -> None:
        self._seqs = {}
        self.epoch += 1
        self.live = live

    def _raise(self, execution_id: str, seq: int) -> None:
        if seq <= self._seqs.get(execution_id, -1):
            return
        if execution_id not in self._seqs and len(self._seqs) >= self.max_entries:
            self._reset(live=True)  # invalidates in-flight tokens: their answers might predate a dropped entry
        self._seqs[execution_id] = seq

    def __len__(self) -> int:
        return len(self._seqs)


def parse_payload(payload: str) -> tuple[str, int] | None:
    """``"<execution_id> <last_seq>"`` → (execution_id, last_seq), None if malformed."""
    eid, _, seq = payload.partition(" ")
    try:
        return canonical_uuid(eid), int(seq)
    except ValueError:
        return None


class VersionReader:
    """``await reader.version(execution_id)`` → ``last_seq``; UnknownParentError when there is no such execution.

    ``await start()`` (from the app's lifespan, on the serving event loop) turns push mode on where the
    backend allows it; ``await close()`` stops the listener and closes the connections.
    """

    def __init__(self, engine: Engine, *, statement_timeout_ms: int, max_idle: int = 8, push: bool = True,
                 max_entries: int = 200_000, heartbeat_s: float = 5.0) -> None:
        self.engine = engine
        self.max_idle = max_idle
        self.statement_timeout_ms = statement_timeout_ms
        self._idle: list[psycopg.AsyncConnection[Any]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self.native = native_async_postgres(engine)
        self.push = push and self.native
        self.map = VersionMap(max_entries)
        self.heartbeat_s = heartbeat_s
        self.min_backoff_s, self.max_backoff_s = 0.05, 5.0  # between failed connection attempts
        self.trigger_recheck_s = 30.0  # without the trigger (database not migrated to 0003)
        self._listener: asyncio.Task[None] | None = None
        self._listen_loop: asyncio.AbstractEventLoop | None = None
        self.connects = 0  # listener connections that went live (for tests and diagnostics)

    # -- reads -----------------------------------------------------------------------------------------
    async def version(self, execution_id: str) -> int:
        if not self.native:
            return await run_in_threadpool(self._sync_version, execution_id)
        loop = asyncio.get_running_loop()
        pushed = loop is self._listen_loop
        if pushed:
            seq = self.map.get(execution_id)
            if seq is not None:
                return seq
        token = self.map.token() if pushed else None
        seq = await self._query(loop, execution_id)
        if pushed:
            self.map.learn(execution_id, seq, token)
        return seq

    def token(self) -> int | None:
        """Call before a write on the serving loop; pass the result to ``written`` after its commit."""
        if self._listen_loop is None or asyncio.get_running_loop() is not self._listen_loop:
            return None
        return self.map.token()

    def written(self, execution_id: str, seq: int, token: int | None) -> None:
        """This worker committed ``last_seq = seq``: serve it at once (read-your-writes) instead of after the
        notification comes back."""
        self.map.learn(execution_id, seq, token)

    def _sync_version(self, execution_id: str) -> int:
        with self.engine.begin() as conn:  # COMMIT, not ROLLBACK: psycopg keeps its prepared statements
            return execution_version(conn, execution_id)

    def _connect_kwargs(self, **extra: Any) -> dict[str, Any]:
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

    async def _query(self, loop: asyncio.AbstractEventLoop, execution_id: str) -> int:
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

    def _discard_all(self) -> None:
        for conn in self._idle:
            conn.pgconn.finish()  # synchronous close; the loop they belonged to may be gone
        self._idle.clear()

    # -- push ------------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Start the listener on the running loop (no-op unless PostgreSQL via psycopg with push on)."""
        if not self.push or self._listener is not None:
            return
        self._listen_loop = asyncio.get_running_loop()
        self._listener = asyncio.create_task(self._listen(), name="sapwood-version-listener")

    async def _listen(self) -> None:
        backoff = self.min_backoff_s
        while True:
            connects = self.connects
            try:
                if not await self._listen_once():
                    log.warning("version listener: no trigger %s on executions (migrate to 0003); versions are "
                                "queried", TRIGGER)
                    await asyncio.sleep(self.trigger_recheck_s)
                    continue
            except (psycopg.Error, OSError, TimeoutError) as exc:
                log.warning("version listener: %s; versions are queried until it reconnects", exc)
            except Exception:  # a bug must not end push for good: the map is off (finally), try again
                log.exception("version listener failed; versions are queried until it reconnects")
            if self.connects != connects:  # it was live: reconnect at once
                backoff = self.min_backoff_s
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self.max_backoff_s)

    async def _listen_once(self) -> bool:
        """One connection's life: LISTEN, go live, apply notifications, heartbeat. Returns False when the trigger
        is missing (never went live, or went away); raises when the connection fails."""
        conn = await psycopg.AsyncConnection.connect(**self._connect_kwargs(application_name=LISTENER_NAME))
        try:
            await conn.execute(f"LISTEN {CHANNEL}")
            if not await self._alive(conn):
                return False
            self.map.connected()  # after LISTEN took effect: from here on no commit goes unnoticed
            self.connects += 1
            while True:
                async for n in conn.notifies(timeout=self.heartbeat_s):
                    parsed = parse_payload(n.payload)
                    if parsed is not None:
                        self.map.notified(*parsed)
                if not await self._alive(conn):
                    return False
        finally:
            self.map.disconnected()
            await conn.close()

    async def _alive(self, conn: psycopg.AsyncConnection[Any]) -> bool:
        """Heartbeat: the connection answers (within the heartbeat period) and the trigger exists."""
        async with asyncio.timeout(self.heartbeat_s):
            cur = await conn.execute(HAS_TRIGGER_SQL, (TRIGGER,))
            row = await cur.fetchone()
        return bool(row and row[0])

    async def close(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener
        self.map.disconnected()
        self._listen_loop = None
        idle, self._idle = self._idle, []
        for conn in idle:
            await conn.close()

