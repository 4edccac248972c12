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
request to the thread pool and back costs more than the query itself); those connections and the
listener's are the store's :class:`~sapwood.platform.storage.versions.VersionChannel`. Other
backends use the thread pool and never push.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from sqlalchemy.engine import Engine
from starlette.concurrency import run_in_threadpool

from sapwood.api.queries.trees import execution_version
from sapwood.platform.errors import StoreUnavailableError
from sapwood.platform.storage.backends import version_channel
from sapwood.platform.storage.versions import VersionChannel

log = logging.getLogger(__name__)


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


class VersionReader:
    """``await reader.version(execution_id)`` → ``last_seq``; UnknownParentError when there is no such execution.

    ``await start()`` (from the app's lifespan, on the serving event loop) turns push mode on where the
    backend allows it; ``await close()`` stops the listener and closes the connections.
    """

    def __init__(self, engine: Engine, *, statement_timeout_ms: int, max_idle: int = 8, push: bool = True,
                 max_entries: int = 200_000, heartbeat_s: float = 5.0) -> None:
        self.engine = engine
        self.statement_timeout_ms = statement_timeout_ms
        #: The store's own connections for versions (queries and the listener), where its backend pushes.
        self.channel: VersionChannel | None = version_channel(engine, statement_timeout_ms=statement_timeout_ms,
                                                              max_idle=max_idle, heartbeat_s=heartbeat_s)
        self.native = self.channel is not None
        self.push = push and self.native
        self.map = VersionMap(max_entries)
        self.min_backoff_s, self.max_backoff_s = 0.05, 5.0  # between failed connection attempts
        self.trigger_recheck_s = 30.0  # without the trigger (database not migrated to 0003)
        self._listener: asyncio.Task[None] | None = None
        self._listen_loop: asyncio.AbstractEventLoop | None = None
        self.connects = 0  # listener connections that went live (for tests and diagnostics)

    # -- reads -----------------------------------------------------------------------------------------
    async def version(self, execution_id: str) -> int:
        if self.channel is None:
            return await run_in_threadpool(self._sync_version, execution_id)
        pushed = asyncio.get_running_loop() is self._listen_loop
        if pushed:
            seq = self.map.get(execution_id)
            if seq is not None:
                return seq
        token = self.map.token() if pushed else None
        seq = await self._query(execution_id)
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

    async def _query(self, execution_id: str) -> int:
        assert self.channel is not None
        return await self.channel.last_seq(execution_id)

    # -- push ------------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Start the listener on the running loop (no-op unless PostgreSQL via psycopg with push on)."""
        if not self.push or self._listener is not None:
            return
        self._listen_loop = asyncio.get_running_loop()
        self._listener = asyncio.create_task(self._listen(), name="sapwood-version-listener")

    async def _listen(self) -> None:
        assert self.channel is not None
        backoff = self.min_backoff_s
        while True:
            connects = self.connects
            try:
                if not await self.channel.listen(live=self._live, notified=self.map.notified,
                                                 down=self.map.disconnected):
                    log.warning("version listener: the store has no version trigger on executions (migrate to "
                                "0003); versions are queried")
                    await asyncio.sleep(self.trigger_recheck_s)
                    continue
            except StoreUnavailableError as exc:
                log.warning("%s; versions are queried until it reconnects", exc)
            except Exception:  # a bug must not end push for good: the map is off (down()), try again
                log.exception("version listener failed; versions are queried until it reconnects")
            if self.connects != connects:  # it was live: reconnect at once
                backoff = self.min_backoff_s
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self.max_backoff_s)

    def _live(self) -> None:
        self.map.connected()
        self.connects += 1

    async def close(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener
        self.map.disconnected()
        self._listen_loop = None
        if self.channel is not None:
            await self.channel.close()
