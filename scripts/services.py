#!/usr/bin/env python3
"""Real PostgreSQL and Apache Kafka servers for Sapwood's tests and CI.

Usage::

    python scripts/services.py install   # PostgreSQL binaries, Kafka broker jars, Chromium (idempotent)
    python scripts/services.py start     # start both, wait until they really answer
    python scripts/services.py env       # print the `export` lines for the tests
    python scripts/services.py status    # what is running (exit 1 if something is down)
    python scripts/services.py stop      # SIGTERM both, wait, remove their data
    python scripts/services.py start vllm  # vLLM CPU server + tiny local model (own cached venv; ~4 GB once)

The servers run natively (no container engine needed):

* PostgreSQL: ``initdb -A trust`` on a fresh directory under the system temp dir
  (owned by the ``postgres`` user when we run as root, since the server refuses
  to run as root), listening on 127.0.0.1 on a free port.
* Kafka: one combined broker+controller (KRaft) on loopback, run from the
  broker jars that ``install`` copies from Maven Central into a cache dir
  (``~/.cache/sapwood/kafka-<version>/libs``; ``SAPWOOD_CACHE_DIR`` moves the
  base ``~/.cache/sapwood``).

The work is done in ``scripts/services_lib/`` (``state``, ``processes``,
``postgres_server``, ``kafka_server``); this file is the command line and
re-exports their names, so loading it by path gives the whole API.

``start`` writes ``.services/state.json`` (pids, ports, directories and the
exact Kafka command line) and ``.services/env`` (shell ``export`` lines). Tests
use ``tests/support/services.py``, which imports this file, to stop and restart
the broker on the same ports and log dir.

Environment: ``SAPWOOD_CACHE_DIR`` (jar cache base), ``SAPWOOD_SERVICES_DIR``
(state dir, default ``<repo>/.services``), ``SAPWOOD_PG_BIN`` (PostgreSQL bin
dir), ``SAPWOOD_PG_DURABLE=1`` (keep fsync on; the default turns it off, as
suits throw-away test servers but not benchmarks).

Only the standard library is needed to install, start and stop; the readiness
checks use psycopg and kafka-python (project dependencies) when importable.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

# the sibling package services_lib, whether this file runs as a script or is loaded by path
sys.path.insert(0, os.fspath(Path(__file__).resolve().parent))
from services_lib.common import (
    KAFKA_JVM_OPTS,
    KAFKA_VERSION,
    READY_TIMEOUT_S,
    REPO_ROOT,
    SCALA_VERSION,
    SLF4J_VERSION,
    STOP_TIMEOUT_S,
    TOOL_JVM_OPTS,
    ServiceError,
    _apt_install,
    _log,
    _run,
)
from services_lib.kafka_server import (
    _POM,
    _java,
    _java_major,
    _kafka_classpath,
    _kafka_ready,
    install_kafka,
    kafka_command,
    kafka_properties,
    launch_kafka,
    new_cluster_id,
    restart_kafka_process,
    start_kafka,
    stop_kafka_process,
)
from services_lib.postgres_server import (
    _as_pg_user,
    _pg_owner,
    _pg_ready,
    find_pg_bin,
    install_postgres,
    restart_postgres_process,
    start_postgres,
    stop_postgres,
)
from services_lib.processes import (
    _pid_cmdline,
    _tail,
    free_port,
    pid_alive,
    port_is_free,
    terminate,
    wait_exit,
)
from services_lib.state import (
    cache_base,
    env_lines,
    env_path,
    env_vars,
    kafka_libs_dir,
    load_state,
    save_state,
    services_dir,
    state_path,
    write_env,
)
from services_lib.verl_env import install_verl
from services_lib.vllm_server import install_vllm, make_tiny_model, start_vllm, stop_vllm

__all__ = [
    "KAFKA_JVM_OPTS",
    "KAFKA_VERSION",
    "READY_TIMEOUT_S",
    "REPO_ROOT",
    "SCALA_VERSION",
    "SLF4J_VERSION",
    "STOP_TIMEOUT_S",
    "TOOL_JVM_OPTS",
    "_POM",
    "ServiceError",
    "_apt_install",
    "_as_pg_user",
    "_java",
    "_java_major",
    "_kafka_classpath",
    "_kafka_ready",
    "_log",
    "_pg_owner",
    "_pg_ready",
    "_pid_cmdline",
    "_run",
    "_tail",
    "cache_base",
    "cmd_env",
    "cmd_install",
    "cmd_start",
    "cmd_start_vllm",
    "cmd_status",
    "cmd_stop",
    "env_lines",
    "env_path",
    "env_vars",
    "find_pg_bin",
    "free_port",
    "install_chromium",
    "install_kafka",
    "install_postgres",
    "install_vllm",
    "kafka_command",
    "kafka_libs_dir",
    "kafka_properties",
    "launch_kafka",
    "load_state",
    "main",
    "make_tiny_model",
    "new_cluster_id",
    "pid_alive",
    "port_is_free",
    "restart_kafka_process",
    "restart_postgres_process",
    "save_state",
    "services_dir",
    "start_kafka",
    "start_postgres",
    "start_vllm",
    "state_path",
    "stop_kafka_process",
    "stop_postgres",
    "stop_vllm",
    "terminate",
    "wait_exit",
    "write_env",
]


# --------------------------------------------------------------------------- commands


def install_chromium() -> str:
    """Headless Chromium for the web viewer's browser tests (Debian's ``chromium`` package)."""
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            _log(f"Chromium present: {found}")
            return found
    _apt_install("chromium")
    found = shutil.which("chromium")
    if found is None:
        raise ServiceError("chromium installed but not on PATH")
    return found


def cmd_install() -> None:
    t0 = time.monotonic()
    install_postgres()
    install_kafka()
    install_chromium()
    install_verl()
    _log(f"install done in {time.monotonic() - t0:.1f}s")


def cmd_start() -> None:
    t0 = time.monotonic()
    services_dir().mkdir(parents=True, exist_ok=True)
    state = load_state()
    pg, kafka = state.get("postgres"), state.get("kafka")
    if pg and not pid_alive(pg.get("pid")):
        stop_postgres(pg)
        pg = None
    if kafka and not pid_alive(kafka.get("pid")):
        kafka = None
    state = {"postgres": pg, "kafka": kafka, "vllm": state.get("vllm")}
    try:
        if pg is None:
            t = time.monotonic()
            state["postgres"] = start_postgres()
            _log(f"PostgreSQL ready on 127.0.0.1:{state['postgres']['port']} in {time.monotonic() - t:.1f}s")
            save_state(state)
        else:
            _log(f"PostgreSQL already running on 127.0.0.1:{pg['port']}")
        if kafka is None:
            t = time.monotonic()
            state["kafka"] = start_kafka()
            _log(f"Kafka ready on 127.0.0.1:{state['kafka']['port']} in {time.monotonic() - t:.1f}s")
        else:
            _log(f"Kafka already running on 127.0.0.1:{kafka['port']}")
    finally:
        save_state(state)
        write_env(state)
    _log(f"start done in {time.monotonic() - t0:.1f}s; env in {env_path()}")


def cmd_start_vllm() -> None:
    """Start the vLLM CPU server (installing it first) next to whatever else runs."""
    state = load_state()
    entry = state.get("vllm")
    if entry and pid_alive(entry.get("pid")):
        _log(f"vLLM already running on {entry['url']}")
        return
    t = time.monotonic()
    state["vllm"] = start_vllm()
    save_state(state)
    write_env(state)
    _log(f"vLLM ready on {state['vllm']['url']} in {time.monotonic() - t:.1f}s; env in {env_path()}")


def cmd_stop() -> None:
    state = load_state()
    if state.get("vllm"):
        stop_vllm(state["vllm"])
        _log("vLLM stopped")
    kafka, pg = state.get("kafka"), state.get("postgres")
    if kafka:
        stop_kafka_process(kafka)
        shutil.rmtree(Path(kafka["log_dir"]), ignore_errors=True)
        _log("Kafka stopped")
    if pg:
        stop_postgres(pg)
        _log("PostgreSQL stopped")
    if state_path().exists():
        state_path().unlink()
    if env_path().exists():
        env_path().unlink()


def cmd_status() -> int:
    state = load_state()
    ok = True
    pg, kafka = state.get("postgres"), state.get("kafka")
    if pg and pid_alive(pg.get("pid")):
        print(
            f"postgres: running pid={pg['pid']} port={pg['port']} data={pg['data_dir']} "
            f"durable={pg.get('durable', False)}"
        )
    else:
        ok = False
        print("postgres: not running")
    if kafka and pid_alive(kafka.get("pid")):
        print(
            f"kafka: running pid={kafka['pid']} port={kafka['port']} "
            f"controller_port={kafka['controller_port']} version={kafka['version']}"
        )
    else:
        ok = False
        print("kafka: not running")
    return 0 if ok else 1


def cmd_env() -> int:
    state = load_state()
    if not state:
        _log("nothing started: run `python scripts/services.py start`")
        return 1
    sys.stdout.write(env_lines(state))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("command", choices=["install", "start", "stop", "status", "env"])
    parser.add_argument(
        "service", nargs="?", choices=["vllm"], help="install/start only the vLLM CPU server (its own cached venv)"
    )
    args = parser.parse_args(argv)
    try:
        if args.service == "vllm" and args.command == "install":
            install_vllm()
            make_tiny_model()
        elif args.service == "vllm" and args.command == "start":
            cmd_start_vllm()
        elif args.command == "install":
            cmd_install()
        elif args.command == "start":
            cmd_start()
        elif args.command == "stop":
            cmd_stop()
        elif args.command == "status":
            return cmd_status()
        elif args.command == "env":
            return cmd_env()
    except ServiceError as exc:
        _log(f"error: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
