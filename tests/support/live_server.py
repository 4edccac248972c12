"""Real servers for the API tests: uvicorn in a thread, or ``sapwood serve``."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import IO, Any

import httpx
import uvicorn
from fastapi import FastAPI


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def serve_in_thread(app: FastAPI, *, timeout_s: float = 30.0, http: Any = "auto",
                    servers: list[uvicorn.Server] | None = None) -> Iterator[str]:
    """Serve ``app`` with uvicorn (httptools, as ``sapwood serve``; ``http``: another protocol class) and
    yield its base URL. ``servers``, when given, receives the uvicorn server (its open connections)."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on",
                                           http=http))
    if servers is not None:
        servers.append(server)
    thread = threading.Thread(target=server.run, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout_s)


@contextlib.contextmanager
def sapwood_serve(env: dict[str, str], *args: str, timeout_s: float = 120.0,
                  output: IO[str] | None = None, pids: list[int] | None = None) -> Iterator[str]:
    """``sapwood serve`` as deployed (a subprocess; ``args`` e.g. ``--workers 2``) on a free port; yields its URL.

    ``pids``, when given, receives the server's process id (``sapwood serve`` becomes the server: same pid).
    """
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "sapwood.platform.cli", "serve", "--port", str(port), *args],
                            env={**os.environ, **env}, stdout=output, stderr=subprocess.STDOUT if output else None)
    base = f"http://127.0.0.1:{port}"
    if pids is not None:
        pids.append(proc.pid)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if httpx.get(base + "/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"sapwood serve did not start (exit {proc.poll()})")
            time.sleep(0.2)
        yield base
    finally:
        proc.terminate()
        proc.wait(30)
