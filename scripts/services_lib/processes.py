"""Ports and processes: free loopback ports, liveness of a pid, SIGTERM-then-SIGKILL, log tails."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from pathlib import Path

from .common import STOP_TIMEOUT_S, _log


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def pid_alive(pid: int | None) -> bool:
    """True while ``pid`` runs (a zombie child of ours counts as exited and is reaped)."""
    if not pid:
        return False
    with contextlib.suppress(ChildProcessError, OSError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def _pid_cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def wait_exit(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(0.1)
    return not pid_alive(pid)


def terminate(pid: int, *, timeout: float = STOP_TIMEOUT_S, expect: str | None = None) -> None:
    """SIGTERM ``pid`` and wait; SIGKILL if it outlives ``timeout``.

    ``expect`` guards against a recycled pid: a process whose command line lacks
    it is left alone.
    """
    if not pid_alive(pid):
        return
    if expect and _pid_cmdline(pid) and expect not in _pid_cmdline(pid):
        _log(f"pid {pid} is no longer {expect!r}; not signalling it")
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    if wait_exit(pid, timeout):
        return
    _log(f"pid {pid} ignored SIGTERM for {timeout:.0f}s; sending SIGKILL")
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    wait_exit(pid, 10)


def _tail(path: str | Path, lines: int = 40) -> str:
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])
