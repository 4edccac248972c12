"""Where a served request's time goes, seen from inside the server (opt-in, ``SAPWOOD_API_TIMING*``).

Per request (seconds, shown in ms): ``queue`` (request head parsed → the app entered: the event loop's
backlog), ``key`` (the API-key check), ``hop`` (waiting for a pool thread), ``back`` (the thread done →
the loop resumed), ``pool`` (waiting for a database connection), ``db`` (statements, and how many),
``json`` (serialisation), ``gc`` (collector pauses while it ran, any thread's) and ``app`` (the app
entered → the response head). ``SAPWOOD_API_TIMING=1`` sends them as a ``Server-Timing`` header;
``SAPWOOD_API_TIMING_DIR`` makes each worker append JSON lines to ``api-timing-<pid>.jsonl`` there: one a
request (``"k": "req"``), one a GC pause (``"gc"``) and one an event-loop lag sample every 10 ms (``"lag"``:
how late a 10 ms sleep woke, i.e. how long the loop was busy with something else).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import time
from collections.abc import AsyncIterator, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypeVar

import orjson
import sqlalchemy as sa
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

T = TypeVar("T")
RECEIVED = "sapwood.received"  # scope key: perf_counter() when the protocol parsed the request's first bytes
LAG_INTERVAL_S = 0.010


@dataclass(slots=True)
class RequestTiming:
    """Seconds one request spent in each phase (see the module docstring)."""

    entered: float
    gc_before: float
    queue: float = 0.0
    key: float = 0.0
    hop: float = 0.0
    back: float = 0.0
    thread: float = 0.0
    pool: float = 0.0
    db: float = 0.0
    db_n: int = 0
    json: float = 0.0
    gc: float = 0.0
    app: float = 0.0

    def header(self) -> bytes:
        parts = [f"{name};dur={getattr(self, name) * 1000:.3f}"
                 for name in ("queue", "key", "hop", "pool", "db", "json", "back", "gc", "app")]
        return (", ".join(parts) + f', db_n;desc="{self.db_n}"').encode()


current: ContextVar[RequestTiming | None] = ContextVar("sapwood_request_timing", default=None)


@dataclass
class GcClock:
    """Cumulative seconds of garbage collection in this process (a ``gc.callbacks`` hook)."""

    total: float = 0.0
    started: float = 0.0
    sink: Callable[[dict[str, Any]], None] | None = None
    installed: bool = field(default=False)

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        now = time.perf_counter()
        if phase == "start":
            self.started = now
            return
        pause = now - self.started
        self.total += pause
        if self.sink is not None:
            self.sink({"k": "gc", "t": time.time(), "gen": info.get("generation"), "ms": round(pause * 1000, 3),
                       "collected": info.get("collected")})

    def install(self) -> None:
        if not self.installed:
            gc.callbacks.append(self)
            self.installed = True


GC_CLOCK = GcClock()


class TimingLog:
    """This worker's JSON-lines file under ``directory`` (buffered; flushed by :func:`monitor`)."""

    def __init__(self, directory: str) -> None:
        Path(directory).mkdir(parents=True, exist_ok=True)
        self.file: IO[bytes] = open(Path(directory) / f"api-timing-{os.getpid()}.jsonl", "ab")  # noqa: SIM115

    def write(self, record: dict[str, Any]) -> None:
        self.file.write(orjson.dumps(record) + b"\n")

    def flush(self) -> None:
        self.file.flush()

    def close(self) -> None:
        self.file.close()


class TimingMiddleware:
    """Times each HTTP request (:class:`RequestTiming`); sends ``Server-Timing`` and/or logs it."""

    def __init__(self, app: ASGIApp, header: bool, log: TimingLog | None) -> None:
        self.app = app
        self.header = header
        self.log = log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        now = time.perf_counter()
        timing = RequestTiming(entered=now, gc_before=GC_CLOCK.total)
        received = scope.get(RECEIVED)
        if received is not None:
            timing.queue = max(0.0, now - received)
        status = 0
        sent = 0

        async def timed_send(message: Message) -> None:
            nonlocal status, sent
            if message["type"] == "http.response.start":
                timing.app = time.perf_counter() - timing.entered
                timing.gc = GC_CLOCK.total - timing.gc_before
                status = message["status"]
                if self.header:
                    message["headers"] = [*message.get("headers", ()), (b"server-timing", timing.header())]
            elif message["type"] == "http.response.body":
                sent += len(message.get("body", b""))
                if self.log is not None and not message.get("more_body", False):
                    self.log.write({"k": "req", "t": time.time(), "path": scope["path"], "status": status,
                                    "bytes": sent, "db_n": timing.db_n,
                                    **{name: round(getattr(timing, name) * 1000, 3) for name in
                                       ("queue", "key", "hop", "back", "thread", "pool", "db", "json", "gc",
                                        "app")}})
            await send(message)

        token = current.set(timing)
        try:
            await self.app(scope, receive, timed_send)
        finally:
            current.reset(token)


async def in_thread(fn: Callable[[], T]) -> T:
    """``run_in_threadpool(fn)``, timing the hop to the thread, the work there and the hop back."""
    timing = current.get()
    if timing is None:
        return await run_in_threadpool(fn)
    submitted = time.perf_counter()
    done = submitted

    def run() -> T:
        nonlocal done
        started = time.perf_counter()
        timing.hop += started - submitted
        try:
            return fn()
        finally:
            done = time.perf_counter()
            timing.thread += done - started

    result = await run_in_threadpool(run)
    timing.back += time.perf_counter() - done
    return result


@contextlib.contextmanager
def phase(name: str) -> Any:
    """Add the block's wall time to the current request's ``name`` (``key``, ``pool``, ``json``)."""
    timing = current.get()
    if timing is None:
        yield
        return
    t0 = time.perf_counter()
    try:
        yield
    finally:
        setattr(timing, name, getattr(timing, name) + time.perf_counter() - t0)


def instrument_engine(engine: sa.Engine) -> None:
    """Add each statement's time on ``engine`` to the current request's ``db`` (SQLAlchemy events)."""

    def before(conn: Any, cursor: Any, statement: Any, params: Any, context: Any, many: Any) -> None:
        conn.info["sapwood_t0"] = time.perf_counter()

    def after(conn: Any, cursor: Any, statement: Any, params: Any, context: Any, many: Any) -> None:
        timing = current.get()
        if timing is not None:
            timing.db += time.perf_counter() - conn.info.pop("sapwood_t0", time.perf_counter())
            timing.db_n += 1

    sa.event.listen(engine, "before_cursor_execute", before)
    sa.event.listen(engine, "after_cursor_execute", after)


@contextlib.asynccontextmanager
async def monitor(log: TimingLog | None) -> AsyncIterator[None]:
    """While serving: GC pauses to ``log``, an event-loop lag sample every 10 ms, the log flushed 5 times a second."""
    if log is None:
        yield
        return
    GC_CLOCK.sink = log.write
    GC_CLOCK.install()

    async def sample() -> None:
        loop = asyncio.get_running_loop()
        last_flush = loop.time()
        while True:
            expected = loop.time() + LAG_INTERVAL_S
            await asyncio.sleep(LAG_INTERVAL_S)
            now = loop.time()
            log.write({"k": "lag", "t": time.time(), "ms": round((now - expected) * 1000, 3)})
            if now - last_flush > 0.2:
                log.flush()
                last_flush = now

    task = asyncio.get_running_loop().create_task(sample())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        GC_CLOCK.sink = None
        log.close()
