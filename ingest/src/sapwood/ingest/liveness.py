"""Liveness that tells the truth: progress per partition, ``/healthz``, a watchdog and a bounded stop.

- :class:`Liveness` — the main loop's heartbeat and, per held partition, its lag and when its stored
  offset last moved; :meth:`Liveness.health` says unhealthy when a partition with lag > 0 made no
  progress for ``stall_after_s`` seconds, or the main loop took no step for that long.
- :func:`serve_health` — one HTTP server: ``/metrics`` (Prometheus) and ``/healthz`` (200, or 503 with a
  JSON ``reasons`` list).
- :class:`Watchdog` — a thread that logs and exits the process with :data:`EXIT_WEDGED` when the main loop
  took no step for ``watchdog_s`` seconds (so a supervisor restarts it).
- :func:`install_stop_signals` — SIGTERM/SIGINT get a handler (no thread dies by the default action) and
  a wakeup fd read by one thread of their own; the first signal asks for a stop and the process exits
  with :data:`EXIT_STOP_TIMEOUT` if it has not ended ``stop_timeout_s`` seconds later, even while the main
  thread is stuck. Call it in the main thread.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

log = logging.getLogger(__name__)

EXIT_WEDGED = 70
"""Exit status when the watchdog finds the main loop stuck."""
EXIT_STOP_TIMEOUT = 71
"""Exit status when SIGTERM/SIGINT did not end the process within its bound."""
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Liveness:
    """Heartbeat of the main loop and progress of each partition (thread-safe; times are monotonic s)."""

    def __init__(self, stall_after_s: float = 60.0, *, clock: Callable[[], float] = time.monotonic) -> None:
        if stall_after_s <= 0:
            raise ValueError(f"stall_after_s must be > 0 seconds, got {stall_after_s}")
        self.stall_after_s = stall_after_s
        self._clock = clock
        self._lock = threading.Lock()
        self._beat = clock()
        self._partitions: dict[int, tuple[int, int, float]] = {}  # partition → (position, lag, progressed at)

    def beat(self) -> None:
        """The main loop took a step."""
        with self._lock:
            self._beat = self._clock()

    def observe(self, partition: int, position: int, lag: int) -> None:
        """A measurement: ``partition``'s stored next offset and lag; progress when the position moved or
        nothing is left to read."""
        now = self._clock()
        with self._lock:
            old = self._partitions.get(partition)
            moved = old is None or old[0] != position or lag == 0
            self._partitions[partition] = (position, lag, now if moved else old[2])  # type: ignore[index]

    def partitions(self) -> set[int]:
        """The partitions measured and not forgotten."""
        with self._lock:
            return set(self._partitions)

    def forget(self, partition: int) -> None:
        with self._lock:
            self._partitions.pop(partition, None)

    def seconds_since_progress(self, partition: int) -> float:
        """Seconds since ``partition`` last progressed (0.0 for a partition not held)."""
        with self._lock:
            entry = self._partitions.get(partition)
        return 0.0 if entry is None else max(0.0, self._clock() - entry[2])

    def seconds_since_beat(self) -> float:
        with self._lock:
            return max(0.0, self._clock() - self._beat)

    def health(self) -> tuple[bool, list[str]]:
        """``(healthy, reasons)``: each reason names a stalled partition or the stuck main loop."""
        now = self._clock()
        with self._lock:
            beat = now - self._beat
            parts = dict(self._partitions)
        reasons = [
            f"partition {p}: lag {lag}, no progress for {now - at:.1f} s (bound {self.stall_after_s} s)"
            for p, (_pos, lag, at) in sorted(parts.items())
            if lag > 0 and now - at > self.stall_after_s
        ]
        if beat > self.stall_after_s:
            reasons.append(f"main loop: no step for {beat:.1f} s (bound {self.stall_after_s} s)")
        return not reasons, reasons


def serve_health(port: int, addr: str, registry: CollectorRegistry, liveness: Liveness) -> ThreadingHTTPServer:
    """Serve ``/metrics`` and ``/healthz`` on ``addr:port`` in a daemon thread; returns the server."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/healthz":
                healthy, reasons = liveness.health()
                body = json.dumps({"status": "ok" if healthy else "unhealthy", "reasons": reasons}).encode()
                self._send(200 if healthy else 503, "application/json", body)
            elif path in ("/metrics", "/"):
                self._send(200, CONTENT_TYPE_LATEST, generate_latest(registry))
            else:
                self._send(404, "text/plain", b"not found: try /metrics or /healthz\n")

        def _send(self, status: int, content_type: str, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the stdlib's name)
            log.debug("health server: " + format, *args)

    server = ThreadingHTTPServer((addr, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="sapwood-health", daemon=True).start()
    return server


def _exit_now(code: int, message: str) -> None:
    log.critical(message)
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stderr.flush()
    os._exit(code)


class Watchdog:
    """Exits the process with :data:`EXIT_WEDGED` when ``liveness`` saw no beat for ``watchdog_s`` s."""

    def __init__(self, liveness: Liveness, watchdog_s: float, *, check_every_s: float | None = None) -> None:
        if watchdog_s <= 0:
            raise ValueError(f"watchdog_s must be > 0 seconds, got {watchdog_s}")
        self.liveness = liveness
        self.watchdog_s = watchdog_s
        self.check_every_s = check_every_s if check_every_s is not None else min(1.0, watchdog_s / 4)
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="sapwood-watchdog", daemon=True)

    def start(self) -> Watchdog:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()

    def _watch(self) -> None:
        while not self._stopped.wait(self.check_every_s):
            stuck = self.liveness.seconds_since_beat()
            if stuck > self.watchdog_s:
                _exit_now(
                    EXIT_WEDGED,
                    f"watchdog: the ingest main loop took no step for {stuck:.1f} s "
                    f"(bound {self.watchdog_s} s); exiting {EXIT_WEDGED}",
                )


def install_stop_signals(on_stop: Callable[[int], None], stop_timeout_s: float) -> threading.Thread:
    """Receive SIGTERM/SIGINT in one thread of their own: the first calls ``on_stop(signum)`` and arms a
    :data:`EXIT_STOP_TIMEOUT` exit ``stop_timeout_s`` seconds later; a second one exits at once with that
    code. Call it in the main thread.

    The signals get a Python handler (so whichever thread the kernel picks, none dies by the default
    action, even one started before this call) and a wakeup fd: the C-level handler writes the signal's
    number to a pipe that the receiving thread reads, so the stop works while the main thread is stuck in
    a call that never returns to the interpreter. SIGTERM/SIGINT are blocked in the receiving thread and
    the timer (``pthread_sigmask``), so they are delivered to a thread that runs the handler."""
    if stop_timeout_s <= 0:
        raise ValueError(f"stop_timeout_s must be > 0 seconds, got {stop_timeout_s}")
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("install_stop_signals must be called in the main thread")
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    for signum in STOP_SIGNALS:
        signal.signal(signum, lambda _s, _f: None)  # the work is done by the receiving thread
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)

    def _next_signal() -> int:
        while True:
            data = os.read(read_fd, 1)
            if data and data[0] in {int(s) for s in STOP_SIGNALS}:
                return data[0]

    def _receive() -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        signum = _next_signal()
        log.info("signal %d: stopping (at most %.1f s)", signum, stop_timeout_s)
        timer = threading.Timer(
            stop_timeout_s,
            _exit_now,
            (
                EXIT_STOP_TIMEOUT,
                f"stop: not ended {stop_timeout_s} s after signal {signum}; exiting {EXIT_STOP_TIMEOUT}",
            ),
        )
        timer.daemon = True
        timer.start()
        on_stop(signum)
        again = _next_signal()
        _exit_now(EXIT_STOP_TIMEOUT, f"second signal {again}: exiting {EXIT_STOP_TIMEOUT} now")

    thread = threading.Thread(target=_receive, name="sapwood-signals", daemon=True)
    thread.start()
    return thread


__all__ = ["EXIT_STOP_TIMEOUT", "EXIT_WEDGED", "Liveness", "Watchdog", "install_stop_signals", "serve_health"]
