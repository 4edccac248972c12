"""Pieces of ``sapwood demo --elastic`` that need no Ray: argument checks and the role timeline."""

from __future__ import annotations

import json
from typing import Any

import pytest
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


def test_elastic_demo_rejects_a_staleness_bound_outside_0_and_1() -> None:
    for bound in ("2", "-1"):
        result = CliRunner().invoke(app, ["demo", "--elastic", "--staleness-bound", bound, "--quiet"],
                                     env={"COLUMNS": "200"})  # the whole message on one line
        assert result.exit_code == 2
        assert f"--staleness-bound must be 0 or 1 (the long-tail workload's bounds), got {bound}" in result.output


def test_the_staleness_bound_reaches_the_demo_s_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """The option is plumbed to ``ElasticDemoConfig`` (the run itself is the e2e test's; here it is replaced)."""
    from sapwood.demo.elastic import driver

    seen: list[driver.ElasticDemoConfig] = []

    def record(cfg: driver.ElasticDemoConfig, **_: Any) -> dict[str, Any]:
        seen.append(cfg)
        return {"config": {"staleness_bound": cfg.staleness_bound}}

    monkeypatch.setattr(driver, "run_elastic_demo", record)
    for bound in (0, 1):
        result = CliRunner().invoke(app, ["demo", "--elastic", "--staleness-bound", str(bound), "--quiet"])
        assert result.exit_code == 0, result.output
        assert json.loads(result.output.strip().splitlines()[-1]) == {"config": {"staleness_bound": bound}}
    assert [c.staleness_bound for c in seen] == [0, 1]
    assert seen[0].workload().staleness_bound == 0


def test_the_learner_backend_reaches_the_demo_s_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--backend`` picks the train cells' learner replicas (``ElasticDemoConfig.learner_backend``)."""
    from sapwood.demo.elastic import driver

    seen: list[str] = []

    def record(cfg: driver.ElasticDemoConfig, **_: Any) -> dict[str, Any]:
        seen.append(cfg.learner_backend)
        return {}

    monkeypatch.setattr(driver, "run_elastic_demo", record)
    for backend in ("torch", "megatron"):
        result = CliRunner().invoke(app, ["demo", "--elastic", "--backend", backend, "--quiet"])
        assert result.exit_code == 0, result.output
    assert seen == ["torch", "megatron"]
    bad = CliRunner().invoke(app, ["demo", "--elastic", "--backend", "jax", "--quiet"], env={"COLUMNS": "200"})
    assert bad.exit_code == 2
    assert "--backend must be one of torch, megatron, got 'jax'" in bad.output
    assert seen == ["torch", "megatron"], "a rejected backend runs nothing"
