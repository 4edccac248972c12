"""Native PostgreSQL for the tests: find or install the binaries, ``initdb`` + ``pg_ctl`` start, stop, restart.

The server listens on 127.0.0.1 on a free port with trust authentication, its data in a fresh
directory under the system temp dir (owned by the ``postgres`` user when we run as root).
"""

from __future__ import annotations

import contextlib
import glob
import os
import shlex
import shutil
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

from .common import READY_TIMEOUT_S, ServiceError, _apt_install, _log, _run
from .processes import _tail, free_port, pid_alive, terminate
from .state import services_dir


def find_pg_bin() -> Path | None:
    """The directory holding ``initdb``/``pg_ctl``: SAPWOOD_PG_BIN, Debian's newest, or PATH."""
    override = os.environ.get("SAPWOOD_PG_BIN")
    if override:
        return Path(override) if (Path(override) / "initdb").exists() else None
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0,
    )
    if candidates:
        return Path(candidates[-1]).parent
    found = shutil.which("initdb") or shutil.which("pg_ctl")
    return Path(found).resolve().parent if found else None


def install_postgres() -> Path:
    bin_dir = find_pg_bin()
    if bin_dir is not None:
        _log(f"PostgreSQL present: {bin_dir}")
        return bin_dir
    _apt_install("postgresql")
    bin_dir = find_pg_bin()
    if bin_dir is None:
        raise ServiceError("postgresql installed but initdb not found")
    return bin_dir


def _as_pg_user(cmd: list[str]) -> list[str]:
    """Run as the ``postgres`` user when we are root (the server refuses root)."""
    if os.geteuid() != 0:
        return cmd
    if shutil.which("runuser"):
        return ["runuser", "-u", "postgres", "--", *cmd]
    return ["su", "-s", "/bin/sh", "postgres", "-c", shlex.join(cmd)]


def _pg_owner() -> tuple[int, int] | None:
    if os.geteuid() != 0:
        return None
    import pwd

    try:
        entry = pwd.getpwnam("postgres")
    except KeyError as exc:
        raise ServiceError("no 'postgres' user: install the postgresql package (services.py install)") from exc
    return entry.pw_uid, entry.pw_gid


def _pg_ready(port: int, timeout: float) -> None:
    """Wait until a real connection runs ``SELECT 1``."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    try:
        import psycopg
    except ImportError:
        psycopg = None  # type: ignore[assignment]
    while time.monotonic() < deadline:
        try:
            if psycopg is not None:
                conninfo = f"host=127.0.0.1 port={port} user=postgres dbname=postgres connect_timeout=3"
                with psycopg.connect(conninfo) as conn:
                    conn.execute("SELECT 1").fetchone()
                return
            with socket.create_connection(("127.0.0.1", port), timeout=2):
                return
        except Exception as exc:
            last = exc
            time.sleep(0.2)
    raise ServiceError(f"PostgreSQL on port {port} not ready after {timeout:.0f}s: {last}")


def start_postgres() -> dict[str, Any]:
    bin_dir = find_pg_bin()
    if bin_dir is None:
        raise ServiceError("PostgreSQL binaries not found: run `python scripts/services.py install`")
    root = Path(tempfile.mkdtemp(prefix="sapwood-pg-"))
    data_dir, socket_dir = root / "data", root / "sock"
    socket_dir.mkdir()
    owner = _pg_owner()
    if owner is not None:
        for path in (root, socket_dir):
            os.chown(path, *owner)
    os.chmod(root, 0o700)
    log_file = root / "postgres.log"
    init = _run(
        _as_pg_user(
            [
                str(bin_dir / "initdb"),
                "-D",
                str(data_dir),
                "-A",
                "trust",
                "-U",
                "postgres",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ]
        )
    )
    if init.returncode != 0:
        shutil.rmtree(root, ignore_errors=True)
        raise ServiceError(f"initdb failed:\n{init.stdout[-2000:]}\n{init.stderr[-2000:]}")
    port = free_port()
    durable = os.environ.get("SAPWOOD_PG_DURABLE", "") not in ("", "0")
    opts = f"-c listen_addresses=127.0.0.1 -p {port} -k {socket_dir} -c max_connections=200"
    if not durable:  # throw-away test server: skip fsyncs (SAPWOOD_PG_DURABLE=1 keeps them, for benchmarks)
        opts += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
    started = _run(
        _as_pg_user(
            [str(bin_dir / "pg_ctl"), "-D", str(data_dir), "-l", str(log_file), "-o", opts, "-w", "-t", "60", "start"]
        )
    )
    if started.returncode != 0:
        tail = _tail(log_file)
        shutil.rmtree(root, ignore_errors=True)
        raise ServiceError(f"pg_ctl start failed:\n{started.stdout[-2000:]}\n{started.stderr[-2000:]}\n{tail}")
    pid_line = (data_dir / "postmaster.pid").read_text().splitlines()[0]
    state = {
        "pid": int(pid_line),
        "port": port,
        "bin_dir": str(bin_dir),
        "root": str(root),
        "data_dir": str(data_dir),
        "socket_dir": str(socket_dir),
        "log": str(log_file),
        "durable": durable,
    }
    try:
        _pg_ready(port, READY_TIMEOUT_S)
    except BaseException:
        stop_postgres(state)
        raise
    return state


def stop_postgres(pg: dict[str, Any]) -> None:
    data_dir = Path(pg["data_dir"])
    if data_dir.exists() and pid_alive(pg.get("pid")):
        result = _run(
            _as_pg_user(
                [str(Path(pg["bin_dir"]) / "pg_ctl"), "-D", str(data_dir), "-m", "fast", "-w", "-t", "60", "stop"]
            )
        )
        if result.returncode != 0:
            _log(f"pg_ctl stop failed ({result.stderr.strip()}); sending SIGTERM")
            terminate(int(pg["pid"]), expect="postgres")
    elif pid_alive(pg.get("pid")):
        terminate(int(pg["pid"]), expect="postgres")
    log_file = Path(pg.get("log", ""))
    if log_file.is_file():
        with contextlib.suppress(OSError):
            shutil.copyfile(log_file, services_dir() / "postgres.log")
    shutil.rmtree(pg["root"], ignore_errors=True)


def restart_postgres_process(pg: dict[str, Any]) -> int:
    """``pg_ctl restart -m fast`` on the same data dir and port (drops every connection)."""
    result = _run(
        _as_pg_user(
            [
                str(Path(pg["bin_dir"]) / "pg_ctl"),
                "-D",
                pg["data_dir"],
                "-l",
                pg["log"],
                "-m",
                "fast",
                "-w",
                "-t",
                "60",
                "restart",
            ]
        )
    )
    if result.returncode != 0:
        raise ServiceError(f"pg_ctl restart failed:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
    pg["pid"] = int((Path(pg["data_dir"]) / "postmaster.pid").read_text().splitlines()[0])
    _pg_ready(int(pg["port"]), READY_TIMEOUT_S)
    return int(pg["pid"])
