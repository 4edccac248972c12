"""The ``sapwood`` command line: every command has --help; the synthetic loader works end to end."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from alembic.script import ScriptDirectory
from typer.testing import CliRunner

from sapwood.platform.cli import app
from sapwood.platform.store import migrations_dir

runner = CliRunner()


def _command_paths(cmd: object, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    paths = [prefix]
    subcommands = getattr(cmd, "commands", None)
    if subcommands:
        for name, sub in subcommands.items():
            paths += _command_paths(sub, (*prefix, name))
    return paths


def test_every_command_has_help() -> None:
    root = typer.main.get_command(app)
    paths = _command_paths(root)
    assert ("synth",) in paths
    assert ("db", "upgrade") in paths
    for path in paths:
        result = runner.invoke(app, [*path, "--help"])
        assert result.exit_code == 0, (path, result.output)
        assert "Usage" in result.output


def test_synth_stats_and_rebuild(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    result = runner.invoke(app, ["synth", "--database-url", url, "--executions", "2", "--calls", "12"])
    assert result.exit_code == 0, result.output
    figures = json.loads(result.output.strip().splitlines()[-1])
    assert figures["executions"] == {"success": 2}
    assert figures["fork_points"] == 8
    assert figures["compactions"] == 4
    assert figures["dedup_ratio"] > 1
    rebuilt = runner.invoke(app, ["rebuild", "--database-url", url])
    assert rebuilt.exit_code == 0
    assert "rebuild identical" in rebuilt.output


def test_db_commands(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'm.db'}"
    assert runner.invoke(app, ["db", "upgrade", "--database-url", url]).exit_code == 0
    head = ScriptDirectory(str(migrations_dir())).get_current_head()
    assert head is not None
    assert head in runner.invoke(app, ["db", "current", "--database-url", url]).output
    assert runner.invoke(app, ["db", "downgrade", "base", "--database-url", url]).exit_code == 0
    assert "base" in runner.invoke(app, ["db", "current", "--database-url", url]).output
