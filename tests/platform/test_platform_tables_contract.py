"""The "platform-tables" import contract names every platform module outside storage/.

import-linter checks only the modules a contract lists, so a new platform module left out of the list
could import the schema's tables unnoticed; this test fails until it is listed (or lives in storage/).
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import sapwood.platform

PLATFORM = Path(sapwood.platform.__file__).resolve().parent
PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
#: The modules allowed to touch the tables: the schema itself, the storage package, the packaged migrations.
ALLOWED = {"schema", "storage", "_migrations"}


def _contract() -> dict[str, object]:
    contracts = tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]["contracts"]
    (found,) = [c for c in contracts if c["id"] == "platform-tables"]
    return found


def test_every_platform_module_outside_storage_is_forbidden_the_schema() -> None:
    contract = _contract()
    assert contract["forbidden_modules"] == ["sapwood.platform.schema"]
    modules = {p.stem for p in PLATFORM.glob("*.py") if p.stem != "__init__"}
    packages = {p.name for p in PLATFORM.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    expected = {f"sapwood.platform.{m}" for m in (modules | packages) - ALLOWED}
    listed = set(contract["source_modules"])  # type: ignore[arg-type]
    assert expected - listed == set(), "platform modules missing from the platform-tables contract"
    assert listed - expected == set(), "the contract lists modules that no longer exist"
