"""The real verl package in a virtualenv of its own, for the verl adapter's tests.

verl 0.9 pins ``transformers`` and ``tensordict`` versions the project's venv need not share, so it lives in
``<cache>/verl-<version>-venv``. That venv sees the project venv's packages (torch, numpy, ray, pyarrow,
pytest, ...) through a ``.pth`` line placed *after* its own site-packages, so what verl pins wins and the
large shared wheels are not installed twice. Tests run verl code in it with the project's source folders on
``PYTHONPATH`` (``SAPWOOD_TEST_VERL_PYTHON`` names its interpreter).
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

from services_lib.common import ServiceError, _log
from services_lib.state import cache_base

VERL_VERSION = "0.9.1"
#: What verl 0.9.1 needs beside its own metadata (``cachetools`` is imported but not declared).
VERL_REQUIREMENTS = [f"verl=={VERL_VERSION}", "transformers>=5.5.3,<5.11,!=5.6.0",
                     "tensordict>=0.8,<=0.10,!=0.9.0", "cachetools"]
CHECK = "import verl, verl.protocol, verl.trainer.ppo.core_algos, verl.experimental.agent_loop.agent_loop"


def verl_venv_dir() -> Path:
    return cache_base() / f"verl-{VERL_VERSION}-venv"


def verl_python() -> Path:
    return verl_venv_dir() / "bin" / "python"


def _works(python: Path) -> bool:
    return python.exists() and subprocess.run([str(python), "-c", CHECK], capture_output=True).returncode == 0


def install_verl() -> Path:
    """Create (or reuse) the verl venv; returns its interpreter."""
    python = verl_python()
    if _works(python):
        _log(f"verl {VERL_VERSION} present: {python}")
        return python
    venv = verl_venv_dir()
    _log(f"installing verl {VERL_VERSION} into {venv}")
    if not python.exists():
        done = subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True, text=True)
        if done.returncode != 0:
            raise ServiceError(f"cannot create {venv}: {done.stderr[-1000:]}")
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    # the project venv's packages, after verl's own (``zz`` sorts the line last among .pth files)
    (Path(site) / "zz_sapwood_project_venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    pip = subprocess.run([str(python), "-m", "pip", "install", "-q", *VERL_REQUIREMENTS], capture_output=True,
                         text=True)
    if pip.returncode != 0:
        raise ServiceError(f"pip install {' '.join(VERL_REQUIREMENTS)} failed:\n{pip.stderr[-2000:]}")
    if not _works(python):
        check = subprocess.run([str(python), "-c", CHECK], capture_output=True, text=True)
        raise ServiceError(f"verl installed but does not import:\n{check.stderr[-2000:]}")
    return python
