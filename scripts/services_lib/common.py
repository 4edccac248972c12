"""Versions, limits, the error type and the subprocess helpers every part of ``services.py`` shares."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

KAFKA_VERSION = "4.1.1"
SCALA_VERSION = "2.13"
SLF4J_VERSION = "2.0.17"
KAFKA_JVM_OPTS = ["-Xms128m", "-Xmx512m", "-XX:+UseG1GC", "-XX:ActiveProcessorCount=2"]
TOOL_JVM_OPTS = ["-Xms64m", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"]
READY_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 60.0

REPO_ROOT = Path(__file__).resolve().parents[2]


class ServiceError(RuntimeError):
    """A service could not be installed, started or stopped; the message says why."""


def _log(msg: str) -> None:
    print(f"[services] {msg}", file=sys.stderr, flush=True)


def _run(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, check=False, text=True, capture_output=True, **kwargs)


def _apt_install(*packages: str) -> None:
    if shutil.which("apt-get") is None:
        raise ServiceError(f"install {' '.join(packages)} with your system's package manager")
    if os.geteuid() != 0:
        raise ServiceError(f"run as root, or install {' '.join(packages)} yourself (apt-get install -y ...)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "install", "-y", "--no-install-recommends", *packages]
    _log(" ".join(cmd))
    if _run(cmd, env=env).returncode == 0:
        return
    _log("apt-get install failed; refreshing the package lists (apt-get update) and retrying")
    update = _run(["apt-get", "update"], env=env)
    if update.returncode != 0:
        raise ServiceError(f"apt-get update failed:\n{update.stderr[-2000:]}")
    again = _run(cmd, env=env)
    if again.returncode != 0:
        raise ServiceError(f"apt-get install {' '.join(packages)} failed:\n{again.stderr[-2000:]}")
