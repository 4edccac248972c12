"""Pieces of ``sapwood demo --elastic`` that need no Ray: argument checks and the role timeline."""

from __future__ import annotations

from typer.testing import CliRunner

from sapwood.demo.elastic.plots import role_segments
from sapwood.platform.cli import app


def test_elastic_demo_rejects_too_few_cells() -> None:
    result = CliRunner().invoke(app, ["demo", "--elastic", "--cells", "1", "--quiet"])
    assert result.exit_code == 2
    assert "--cells ≥ 2" in result.output


def test_role_segments_merge_ticks_and_end_at_the_wall_time() -> None:
    timeline = [(0.0, {"a": "rollout"}), (1.0, {"a": "rollout"}), (2.5, {"a": "train"}), (4.0, {"a": "rollout"})]
    assert role_segments(timeline, "a", 5.0) == [(0.0, 2.5, "rollout"), (2.5, 4.0, "train"), (4.0, 5.0, "rollout")]
    assert role_segments([(0.0, {"a": "idle"})], "a", 0.0) == [(0.0, 0.0, "idle")]


def test_scheduler_run_rejects_an_unknown_actuator() -> None:
    result = CliRunner().invoke(app, ["scheduler", "run", "--actuator", "k8s", "--ticks", "1"])
    assert result.exit_code == 2
    assert "--actuator must be 'logging' or 'ray'" in result.output
