"""Where ``services.py`` keeps its state (``state.json``, ``env``, logs, jar cache) and the test variables.

``state.json`` holds ``{"postgres": {...} | null, "kafka": {...} | null}``: pids, ports,
directories and the broker's command line, as ``start`` recorded them.
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from typing import Any

from .common import KAFKA_VERSION, REPO_ROOT, ServiceError


def services_dir() -> Path:
    """Where state, env file and logs live (``<repo>/.services`` unless SAPWOOD_SERVICES_DIR)."""
    return Path(os.environ.get("SAPWOOD_SERVICES_DIR", REPO_ROOT / ".services")).resolve()


def state_path() -> Path:
    return services_dir() / "state.json"


def env_path() -> Path:
    return services_dir() / "env"


def cache_base() -> Path:
    return Path(os.environ.get("SAPWOOD_CACHE_DIR", Path.home() / ".cache" / "sapwood")).expanduser()


def kafka_libs_dir(version: str = KAFKA_VERSION) -> Path:
    return cache_base() / f"kafka-{version}" / "libs"




def load_state(path: Path | None = None) -> dict[str, Any]:
    path = path or state_path()
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ServiceError(f"cannot read {path}: {exc}") from exc
    return data if isinstance(data, dict) else {}


def save_state(state: dict[str, Any], path: Path | None = None) -> None:
    path = path or state_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)


def env_vars(state: dict[str, Any]) -> dict[str, str]:
    """The variables tests read, derived from the state written by ``start``."""
    out: dict[str, str] = {"SAPWOOD_TEST_SERVICES_STATE": str(state_path())}
    pg = state.get("postgres")
    if pg:
        out.update(
            SAPWOOD_TEST_DATABASE_URL=f"postgresql+psycopg://postgres@127.0.0.1:{pg['port']}/postgres",
            SAPWOOD_TEST_PG_BIN=pg["bin_dir"],
            SAPWOOD_TEST_PG_DATA=pg["data_dir"],
            SAPWOOD_TEST_PG_PORT=str(pg["port"]),
            SAPWOOD_TEST_PG_SOCKET_DIR=pg["socket_dir"],
        )
    kafka = state.get("kafka")
    if kafka:
        out.update(
            SAPWOOD_TEST_KAFKA_BOOTSTRAP=f"127.0.0.1:{kafka['port']}",
            SAPWOOD_TEST_KAFKA_CONTROLLER_PORT=str(kafka["controller_port"]),
            SAPWOOD_TEST_KAFKA_CONFIG=kafka["config"],
            SAPWOOD_TEST_KAFKA_LOG_DIR=kafka["log_dir"],
        )
    vllm = state.get("vllm")
    if vllm:
        out.update(SAPWOOD_TEST_VLLM_URL=vllm["url"], SAPWOOD_TEST_VLLM_MODEL_DIR=vllm["model_dir"])
    from services_lib.verl_env import verl_python

    if verl_python().exists():
        out["SAPWOOD_TEST_VERL_PYTHON"] = str(verl_python())
    return out


def env_lines(state: dict[str, Any]) -> str:
    return "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env_vars(state).items())


def write_env(state: dict[str, Any]) -> None:
    env_path().write_text(env_lines(state))
