"""``pip install sapwood`` (no extra) records, transports, stores and ingests without torch, matplotlib or pyarrow.

The subprocess tests block those three packages with an import hook (a finder that refuses them), so
a module-level import anywhere on the recorder / store / ingest paths fails them even though the test
venv has every extra installed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "matplotlib", "pyarrow")

BLOCKER = textwrap.dedent('''
    import importlib.abc, sys

    class _Blocker(importlib.abc.MetaPathFinder):
        """Refuse torch, matplotlib and pyarrow, as if they were not installed."""

        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in {"torch", "matplotlib", "pyarrow"}:
                raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)", name=name)
            return None

    sys.meta_path.insert(0, _Blocker())
''')


def _name(requirement: str) -> str:
    """The distribution name of a PEP 508 requirement (``"torch>=2.2"`` → ``torch``)."""
    return re.split(r"[\s\[<>=!~;]", requirement.strip(), maxsplit=1)[0].lower()


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _run(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-c", BLOCKER + textwrap.dedent(code), *args], capture_output=True,
                          text=True, env=env, timeout=120, cwd=ROOT)


def test_base_dependencies_hold_no_torch_plotting_or_pyarrow() -> None:
    project = _project()
    base = {_name(r) for r in project["dependencies"]}
    assert not base & set(HEAVY), f"base dependencies must not pull {sorted(base & set(HEAVY))}"
    extras = {k: {_name(r) for r in v} for k, v in project["optional-dependencies"].items()}
    assert {"torch", "matplotlib"} <= extras["demo"]
    assert "pyarrow" in extras["api"]  # Parquet export
    assert "torch" in extras["learner"]
    # `all` names every other extra, so scripts/test's `pip install -e '.[all]'` installs everything.
    (all_req,) = project["optional-dependencies"]["all"]
    named = set(re.fullmatch(r"sapwood\[(.*)\]", all_req).group(1).split(","))  # type: ignore[union-attr]
    # gpu (sglang) needs a GPU machine; verl pins transformers/tensordict of its own (a venv of its own);
    # fuzz (atheris, a native build) is for the on-demand coverage-guided run only
    assert named == set(extras) - {"all", "gpu", "verl", "fuzz"}, named


def test_recorder_store_and_ingest_import_and_record_without_the_heavy_packages(tmp_path: Path) -> None:
    db = tmp_path / "base.db"
    proc = _run('''
        import importlib, json, pkgutil, sys
        import numpy as np

        import sapwood.ingest
        import sapwood.rollout
        from sapwood.rollout import InProcessTransport, Recorder, make_transport  # noqa: F401
        import sapwood.rollout.engines, sapwood.rollout.transports, sapwood.rollout.recorder  # noqa: F401
        from sapwood.platform.store import Store

        ingest = [m.name for m in pkgutil.iter_modules(sapwood.ingest.__path__, "sapwood.ingest.")
                  if m.name != "sapwood.ingest.__main__"]  # that one runs the command
        for name in ingest:
            importlib.import_module(name)

        store = Store.open("sqlite:///" + sys.argv[1])
        recorder = Recorder(InProcessTransport(store), run_id="base", engine="test", vocab_size=32)
        with recorder.start("task-0", prompt=[1, 2, 3]) as ex:
            ex.call([1, 2, 3], [4, 5], np.array([-0.5, -0.25], dtype=np.float32), policy_version=0)
            ex.observe([6])
            ex.finish("success", reward=1.0)
        recorder.close()
        stats = store.stats()
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in {"torch", "matplotlib", "pyarrow"})
        print(json.dumps({"ingest": ingest, "executions": stats["executions"], "calls": stats["calls"],
                          "finished": store.finished_executions("base"), "heavy": heavy}))
    ''', str(db))
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {"sapwood.ingest.service", "sapwood.ingest.deadletters"} <= set(out["ingest"])
    assert out["executions"] == {"success": 1}
    assert out["calls"] == 1
    assert out["finished"] == 1
    assert out["heavy"] == []


def test_cli_starts_and_names_the_demo_extra_without_it(tmp_path: Path) -> None:
    db = tmp_path / "cli.db"
    proc = _run('''
        import json, sys
        from typer.testing import CliRunner
        from sapwood.platform.cli import app

        runs = {name: CliRunner().invoke(app, args) for name, args in [
            ("help", ["--help"]), ("demo", ["demo", "--quiet"]), ("elastic", ["demo", "--elastic", "--quiet"]),
            ("learn", ["learn", "--run", "r"]), ("stats", ["stats", "--database-url", "sqlite:///" + sys.argv[1]]),
            ("ingest", ["ingest", "--help"]), ("serve", ["serve", "--help"])]}
        print(json.dumps({name: [r.exit_code, " ".join(r.output.split())] for name, r in runs.items()}))
    ''', str(db))
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["help"][0] == 0
    assert "demo" in out["help"][1]
    assert "ingest" in out["help"][1]
    assert out["stats"][0] == 0, out["stats"]  # base commands work
    assert out["ingest"][0] == 0
    assert "--bootstrap" in out["ingest"][1]  # the compose ingest service's install
    # The API imports pyarrow (Parquet export) with its routes: pyarrow is the api extra's.
    assert out["serve"][0] == 1
    assert "pyarrow" in out["serve"][1]
    assert "sapwood[api]" in out["serve"][1]
    assert out["demo"][0] == 1
    assert "torch" in out["demo"][1]
    assert "install sapwood[demo] (pip install 'sapwood[demo]')" in out["demo"][1]
    assert out["elastic"][0] == 1
    assert "sapwood[demo" in out["elastic"][1]
    assert out["learn"][0] == 1
    assert "sapwood[learner]" in out["learn"][1]
