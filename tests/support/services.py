"""Control the native test servers started by ``scripts/services.py`` from inside tests.

The start/stop logic lives in ``scripts/services.py`` (one place); this module
loads it by path and works on the state that ``services.py start`` recorded
(``SAPWOOD_TEST_SERVICES_STATE``, else ``<repo>/.services/state.json``)::

    from tests.support.services import restart_kafka

    restart_kafka()          # SIGTERM the broker, start it on the same ports and log dir, wait ready

Servers that were not started by ``services.py`` (an external URL, a
testcontainers container) cannot be restarted: the functions raise
``ServicesUnavailable``.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
_SCRIPT = REPO_ROOT / "scripts" / "services.py"
_MODULE_NAME = "sapwood_test_services_script"

__all__ = [
    "ServicesUnavailable",
    "kafka_pid",
    "load_state",
    "restart_kafka",
    "restart_postgres",
    "services_module",
    "start_kafka",
    "stop_kafka",
]


class ServicesUnavailable(RuntimeError):
    """No state from ``scripts/services.py start``: the servers are not ours to control."""


def services_module() -> ModuleType:
    """``scripts/services.py`` imported as a module (cached in ``sys.modules``)."""
    module = sys.modules.get(_MODULE_NAME)
    if module is not None:
        return module
    spec = importlib.util.spec_from_file_location(_MODULE_NAME, _SCRIPT)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {_SCRIPT}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[_MODULE_NAME] = module
    spec.loader.exec_module(module)
    return module


def _state_file() -> Path:
    env = os.environ.get("SAPWOOD_TEST_SERVICES_STATE")
    return Path(env) if env else Path(services_module().state_path())


def load_state() -> dict[str, Any]:
    """The recorded state; raises ``ServicesUnavailable`` when ``services.py start`` did not run."""
    path = _state_file()
    state: dict[str, Any] = services_module().load_state(path)
    if not state:
        raise ServicesUnavailable(f"no service state at {path}: run `python scripts/services.py start`")
    return state


def _kafka_state(state: dict[str, Any]) -> dict[str, Any]:
    kafka = state.get("kafka")
    if not kafka:
        raise ServicesUnavailable("Kafka was not started by scripts/services.py")
    return dict(kafka)


def _save(state: dict[str, Any]) -> None:
    services_module().save_state(state, _state_file())


def kafka_pid() -> int | None:
    """The broker's pid while it runs, else None."""
    kafka = _kafka_state(load_state())
    pid = kafka.get("pid")
    return int(pid) if pid and services_module().pid_alive(int(pid)) else None


def stop_kafka() -> None:
    """SIGTERM the broker and wait until it exits; its log dir and ports stay reserved in the state."""
    state = load_state()
    kafka = _kafka_state(state)
    services_module().stop_kafka_process(kafka)
    state["kafka"] = kafka
    _save(state)


def start_kafka() -> int:
    """Start the broker again on the recorded ports and log dir; return its pid once it answers."""
    state = load_state()
    kafka = _kafka_state(state)
    mod = services_module()
    if kafka.get("pid") and mod.pid_alive(int(kafka["pid"])):
        return int(kafka["pid"])
    try:
        pid = int(mod.launch_kafka(kafka))
    finally:
        state["kafka"] = kafka
        _save(state)
    return pid


def restart_kafka() -> int:
    """Stop the broker with SIGTERM, start it on the same ports and log dir, wait until ready."""
    stop_kafka()
    return start_kafka()


def restart_postgres() -> int:
    """Fast-restart PostgreSQL on the same data dir and port (every open connection is dropped)."""
    state = load_state()
    pg = state.get("postgres")
    if not pg:
        raise ServicesUnavailable("PostgreSQL was not started by scripts/services.py")
    pg = dict(pg)
    try:
        pid = int(services_module().restart_postgres_process(pg))
    finally:
        state["postgres"] = pg
        _save(state)
    return pid
