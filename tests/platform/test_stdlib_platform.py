"""The stdlib ``platform`` module must never be shadowed by the project's ``platform/`` folder."""

from __future__ import annotations

import importlib
import subprocess
import sys
import sysconfig
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_stdlib_platform_works() -> None:
    import platform

    assert platform.system()
    assert platform.python_version().startswith(f"{sys.version_info.major}.{sys.version_info.minor}")


def test_platform_module_is_the_stdlib_one() -> None:
    import platform

    stdlib = Path(sysconfig.get_paths()["stdlib"]).resolve()
    assert platform.__file__ is not None
    assert Path(platform.__file__).resolve().parent == stdlib


def test_sapwood_platform_is_the_package_under_platform_src() -> None:
    module = importlib.import_module("sapwood.platform")
    assert module.__file__ is not None
    package_dir = Path(module.__file__).resolve().parent
    assert package_dir == (REPO_ROOT / "platform" / "src" / "sapwood" / "platform").resolve()


def test_platform_not_shadowed_from_repo_root() -> None:
    """``python -c`` from the repo root puts the root on sys.path: stdlib platform must still win."""
    code = (
        "import platform, sqlalchemy, sysconfig, pathlib;"
        "assert platform.system();"
        "p = pathlib.Path(platform.__file__).resolve().parent;"
        "assert p == pathlib.Path(sysconfig.get_paths()['stdlib']).resolve(), p"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=True)
