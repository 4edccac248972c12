"""Lazy package exports: the ``sapwood`` CLI starts without torch or FastAPI; the exports resolve on first use."""

from __future__ import annotations

import json
import subprocess
import sys
import types

import pytest

from sapwood.platform.lazy_exports import lazy_exports


def test_the_cli_and_the_scheduler_command_import_neither_torch_nor_fastapi_nor_kafka() -> None:
    script = ("import sys\nfrom sapwood.platform.cli import app\nimport sapwood.scheduler.live_loop_cli\n"
              "import json\nprint(json.dumps(sorted({m.split('.')[0] for m in sys.modules} & "
              "{'torch', 'fastapi', 'pyarrow', 'kafka'})))")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=True)
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []


def test_an_export_resolves_on_first_use_and_is_kept_in_the_package() -> None:
    import sapwood.learner as learner
    from sapwood.learner.trainer import SAOTrainer

    assert learner.SAOTrainer is SAOTrainer
    assert learner.__dict__["SAOTrainer"] is SAOTrainer
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        learner.nothing_here  # noqa: B018
    from sapwood.learner import horizon  # a submodule that is not an export still imports

    assert horizon.__name__ == "sapwood.learner.horizon"


def test_a_missing_distribution_fails_the_package_import_naming_it() -> None:
    with pytest.raises(ModuleNotFoundError) as exc:
        lazy_exports("pkg", ["x"], ("sub",), needs=("json", "no_such_distribution_sapwood"))
    assert exc.value.name == "no_such_distribution_sapwood"


def test_an_export_no_submodule_defines_is_an_attribute_error(monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = types.ModuleType("sapwood_lazy_probe")
    pkg.__path__ = []
    sub = types.ModuleType("sapwood_lazy_probe.sub")
    sub.there = 1  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "sapwood_lazy_probe", pkg)
    monkeypatch.setitem(sys.modules, "sapwood_lazy_probe.sub", sub)
    get = lazy_exports("sapwood_lazy_probe", ["there", "missing"], ("sub",))
    assert get("there") == 1
    assert pkg.there == 1  # type: ignore[attr-defined]
    with pytest.raises(AttributeError, match="none of"):
        get("missing")
