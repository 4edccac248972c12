"""The process that serves HTTP: uvicorn over :func:`sapwood.api.main.create_app` on an inherited socket.

``sapwood serve`` prepares (migrations, the listening socket, the cursor secret) and then *replaces
itself* with ``python -m sapwood.api.server --fd N ...``. The ``sapwood`` command registers every
component's sub-commands at import, and some of them import torch and the learner; a server started
from that process (or spawned by it: uvicorn's workers re-import the parent's main module) would keep
hundreds of MB of torch per worker it never uses. This module imports only uvicorn and the API.
"""

from __future__ import annotations

import argparse
import inspect
import os
import sys
from collections.abc import Sequence
from typing import Any


def server_command(fd: int, *, workers: int, log_level: str, max_header_bytes: int) -> list[str]:
    """argv that runs this module with the given settings (for :func:`os.execv`)."""
    return [sys.executable, "-m", "sapwood.api.server", "--fd", str(fd), "--workers", str(workers),
            "--log-level", log_level, "--max-header-bytes", str(max_header_bytes)]


def run(argv: Sequence[str] | None = None) -> None:
    """Parse :func:`server_command`'s arguments and run uvicorn until it is told to stop."""
    import uvicorn

    from sapwood.api.config import ApiSettings
    from sapwood.api.http_protocol import GuardedHttpToolsProtocol

    parser = argparse.ArgumentParser(prog="sapwood.api.server")
    parser.add_argument("--fd", type=int, required=True, help="listening socket inherited from `sapwood serve`")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--max-header-bytes", type=int, required=True)
    args = parser.parse_args(argv)
    extra: dict[str, Any] = {}
    if "timeout_worker_healthcheck" in inspect.signature(uvicorn.run).parameters:
        extra["timeout_worker_healthcheck"] = 60  # a busy machine can take longer than the 5 s default to import
    extra["h11_max_incomplete_event_size"] = args.max_header_bytes  # if h11 is ever selected instead
    settings = ApiSettings()
    # header size/count limits while reading, request-read timeout, per-client connection cap
    uvicorn.run("sapwood.api.main:create_app", factory=True, fd=args.fd, workers=args.workers,
                http=f"{GuardedHttpToolsProtocol.__module__}:{GuardedHttpToolsProtocol.__name__}",
                timeout_keep_alive=settings.api_keep_alive_s,
                log_level=args.log_level, access_log=args.log_level == "debug", **extra)


def exec_server(fd: int, *, workers: int, log_level: str, max_header_bytes: int) -> None:
    """Replace the current process by the server (same pid, so signals sent to ``sapwood serve`` reach it)."""
    sys.stdout.flush()
    sys.stderr.flush()
    argv = server_command(fd, workers=workers, log_level=log_level, max_header_bytes=max_header_bytes)
    os.execv(argv[0], argv)


if __name__ == "__main__":
    run()
