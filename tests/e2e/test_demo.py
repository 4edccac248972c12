"""The end-to-end demo: rollout workers, recorder, store, learner, policy versions — embedded and over servers.

One embedded run (module fixture) backs several checks: the store holds exactly what the
workers recorded, summaries are trainable tokens, timeouts carry partial scores, and the
reward improves over its start with a fixed seed. The same demo then runs over PostgreSQL
and Kafka with the ingest service.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa
import torch
from typer.testing import CliRunner

from sapwood.demo.config import DemoConfig, DemoResult
from sapwood.demo.driver import run_demo
from sapwood.demo.pretrain import PretrainConfig
from sapwood.learner.assembly import build_batch
from sapwood.learner.batch import SUMMARY
from sapwood.learner.config import SourceConfig
from sapwood.platform import schema as t
from sapwood.platform.store import Store

#: Short but long enough to learn: ~250 rollouts after a brief pre-training (seed fixed).
EMBEDDED = DemoConfig(seed=0, executions=256, eval_executions=32, max_seconds=150, keep_calls=True)


@pytest.fixture(scope="module")
def embedded(tmp_path_factory: pytest.TempPathFactory) -> DemoResult:
    return run_demo(replace(EMBEDDED, out_dir=tmp_path_factory.mktemp("demo")))


def check_store_matches_workers(result: DemoResult) -> None:
    """Every call reconstructs exactly from the tree; summaries train; timeouts carry partial scores."""
    store = Store.open(result.database_url)
    try:
        calls = [c for r in result.reports for c in r.call_log or []]
        assert len(calls) == sum(r.calls for r in result.reports) > 0
        for call in calls:
            assert store.reconstruct_input(call.call_id).tolist() == list(call.input_ids)
            out, lps = store.call_output(call.call_id)
            assert out.tolist() == list(call.output_ids)
            np.testing.assert_allclose(lps, call.logprobs)
        with store.transaction() as conn:
            rows = {r.execution_id: r for r in conn.execute(
                sa.select(t.executions).where(t.executions.c.run_id == result.rollout_run))}
            versions = [r[0] for r in conn.execute(
                sa.select(t.policy_versions.c.version).where(t.policy_versions.c.run_id == result.train_run))]
            call_versions = {r.call_id: r.policy_version for r in conn.execute(sa.select(t.calls))}
        assert set(rows) == {r.execution_id for r in result.reports}
        assert versions
        assert min(versions) == 0
        assert max(versions) == result.summary["policy_version"]
        for call in calls:  # the version that served each call is what the store says
            assert call_versions[call.call_id] == call.policy_version
        timeouts = [r for r in result.reports if r.status == "timeout"]
        assert timeouts, "the demo should produce timed-out executions"
        for r in timeouts:
            row = rows[r.execution_id]
            assert row.status == "timeout"
            assert row.score is not None
            assert row.reward == pytest.approx(row.score) == pytest.approx(r.partial_score)
        with_summary = [r.execution_id for r in result.reports if r.summary_calls][:8]
        batch, _ = build_batch(store, with_summary, SourceConfig())
        summary = batch.role == SUMMARY
        assert int(summary.sum()) > 0
        assert bool(batch.trainable[summary].all())
        assert store.stats()["compactions"] >= sum(r.compactions for r in result.reports)
    finally:
        store.close()


def test_store_holds_what_the_workers_recorded(embedded: DemoResult) -> None:
    check_store_matches_workers(embedded)


def test_fixed_seed_run_improves_mean_reward(embedded: DemoResult) -> None:
    s = embedded.summary
    assert s["reward_end"] > s["reward_start"] + 0.05, s
    assert s["rollout_reward_last"] > s["rollout_reward_first"], s


def test_run_reports_its_figures(embedded: DemoResult) -> None:
    s = embedded.summary
    assert s["executions"] == EMBEDDED.executions
    assert not s["time_capped"]
    assert s["trained_executions"] == s["executions"]  # every rollout trained exactly once
    assert s["compactions"] > 0
    assert s["forks"] > 0
    assert s["timeouts"] > 0
    assert 0.0 < s["timeout_partial_score_mean"] < 1.0
    assert s["dedup_ratio"] > 1.5  # forks and growing contexts share prefixes
    assert 0.0 < s["staleness_mean"] <= s["staleness_max"] <= EMBEDDED.max_backlog
    assert s["learner_steps"] >= s["policy_version"] > 10
    for name in ("reward.png", "lag.png", "summary.json", "learner_metrics.jsonl"):
        path = embedded.out_dir / name
        assert path.exists()
        assert path.stat().st_size > 0
    assert json.loads((embedded.out_dir / "summary.json").read_text())["reward_end"] == s["reward_end"]
    ckpts = sorted((embedded.out_dir / "checkpoints").glob("policy-v*.pt"))
    assert ckpts[0].name == "policy-v000000.pt"
    assert len(ckpts) <= EMBEDDED.keep_checkpoints + 1


def test_demo_over_postgresql_and_kafka(pg_url: str, kafka_bootstrap: str, tmp_path: Path) -> None:
    cfg = replace(EMBEDDED, executions=24, eval_executions=4, database_url=pg_url, kafka_bootstrap=kafka_bootstrap,
                  pretrain=PretrainConfig(max_clean_steps=20, min_clean_steps=0, noisy_steps=5), out_dir=tmp_path,
                  max_seconds=120)
    result = run_demo(cfg)
    s = result.summary
    assert (s["store"], s["transport"]) == ("postgresql", "kafka")
    assert s["executions"] == 24
    assert s["trained_executions"] == 24
    check_store_matches_workers(result)
    store = Store.open(pg_url)
    try:
        stats = store.stats()
        assert sum(stats["executions"].values()) == 24 + 2 * 4  # training rollouts + both evaluations
        with store.transaction() as conn:
            assert conn.execute(sa.select(sa.func.count()).select_from(t.dead_letters)).scalar_one() == 0
    finally:
        store.close()


def test_cli_prints_a_json_line_last(tmp_path: Path) -> None:
    from sapwood.platform.cli import app

    args = ["demo", "--executions", "8", "--eval-executions", "2", "--pretrain-steps", "3", "--pretrain-noisy-steps",
            "2", "--out-dir", str(tmp_path), "--quiet", "--seed", "3"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    line = json.loads(result.stdout.strip().splitlines()[-1])
    assert line["executions"] == 8
    assert line["seed"] == 3
    assert len(line["plots"]) == 2
    bad = CliRunner().invoke(app, ["demo", "--loss", "mean", "--quiet"])
    assert bad.exit_code != 0


def run_ablation_cli(tmp_path: Path, kind: str) -> dict[str, Any]:
    """``sapwood demo --ablation KIND`` at a tiny size; returns its JSON line."""
    from sapwood.platform.cli import app

    args = ["demo", "--ablation", kind, "--executions", "6", "--eval-executions", "2", "--pretrain-steps",
            "3", "--pretrain-noisy-steps", "2", "--out-dir", str(tmp_path), "--quiet"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    line: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return line


def test_cli_ablation_prints_both_arms_and_a_verdict(tmp_path: Path) -> None:
    line = run_ablation_cli(tmp_path, "summarizer")
    assert set(line["arms"]) == {"baseline", "frozen summarizer"}
    assert [a["train_summaries"] for a in (line["arms"]["baseline"][0], line["arms"]["frozen summarizer"][0])] == [
        True, False]
    (verdict,) = line["comparisons"]
    assert verdict["arm"] == "frozen summarizer"
    assert "55.5" in verdict["source"]
    assert isinstance(verdict["direction_reproduced"], bool)


def test_demo_with_the_megatron_backend(tmp_path: Path) -> None:
    """The learner on megatron-core: its checkpoints are served by the workers, reward reported at both ends."""
    from tests.support.megatron_ranks import require_megatron

    require_megatron()
    from sapwood.platform.cli import app

    args = ["demo", "--backend", "megatron", "--executions", "24", "--eval-executions", "8", "--pretrain-steps",
            "40", "--pretrain-noisy-steps", "5", "--out-dir", str(tmp_path), "--quiet", "--seed", "1",
            "--max-backlog", "2", "--threads", "1"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    s = json.loads(result.stdout.strip().splitlines()[-1])
    assert s["backend"] == "megatron"
    assert s["executions"] == 24
    assert not s["time_capped"]
    assert s["trained_executions"] == 24
    assert s["worker_errors"] == 0
    assert s["policy_version"] >= 1
    assert s["learner_steps"] > 4  # past the 4 critic warm-up steps
    assert 0.0 <= s["reward_start"] <= 1.0
    assert 0.0 <= s["reward_end"] <= 1.0
    ckpts = sorted((tmp_path / "checkpoints").glob("policy-v*.pt"))
    assert len(ckpts) >= 2
    assert torch.load(ckpts[-1], weights_only=False)["backend"]["backend_kind"] == "megatron"
    bad = CliRunner().invoke(app, ["demo", "--backend", "jax", "--quiet"])
    assert bad.exit_code != 0
    assert "backend must be one of" in bad.output


def test_cli_fork_ablation_runs_both_weightings_on_the_forking_task(tmp_path: Path) -> None:
    line = run_ablation_cli(tmp_path, "forks")
    arms = line["arms"]
    assert list(arms) == ["fork task, path weights", "fork task, unit weights"]
    assert [a[0]["fork_weighting"] for a in arms.values()] == ["path", "unit"]
    (verdict,) = line["comparisons"]
    assert verdict["reference"] == "fork task, path weights"
    assert verdict["arm"] == "fork task, unit weights"
    assert len(verdict["arm_eval_forks_end"]) == 1
