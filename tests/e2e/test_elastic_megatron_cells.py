"""The elastic schedule live with megatron-core learner replicas on the cells (``--backend megatron``): the
core trains a ``MegatronBackend`` (policy steps over the cells' micro-batches; the critic arrives warmed from replay),
satellites compute micro-batches on megatron models, and rollout cells serve the broadcast weights."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from sapwood.demo.elastic.compare import INTEGRITY  # noqa: E402
from sapwood.demo.elastic.driver import ElasticDemoConfig, run_elastic_demo  # noqa: E402
from sapwood.demo.pretrain import PretrainConfig  # noqa: E402
from tests.support.elastic_runtime import fresh_ray  # noqa: E402, F401
from tests.support.megatron_ranks import require_megatron  # noqa: E402

require_megatron()


@pytest.mark.usefixtures("fresh_ray")
def test_the_elastic_schedule_trains_megatron_replicas_on_the_cells(tmp_path: Path) -> None:
    cfg = ElasticDemoConfig(executions=16, eval_executions=8, out_dir=tmp_path, schedules=("elastic",),
                            critic_replay_executions=16,
                            learner_backend="megatron",
                            pretrain=replace(PretrainConfig(), max_clean_steps=3, min_clean_steps=3))
    summary = run_elastic_demo(cfg)
    run = summary["schedules"]["elastic"]
    assert run["learner_replica"] == "MegatronBackend"
    assert summary["critic_warmup"]["steps"] == 2, "16 replayed executions, 8 per critic step, before the arm"
    kept = json.loads((tmp_path / "summary.json").read_text())
    assert kept == json.loads(json.dumps(summary)), "the summary is kept in the out dir (as JSON: tuples as lists)"
    assert run["steps"] >= 2
    policy_steps = run["steps"] - cfg.critic_warmup_steps  # an in-run warm-up step is the core's alone, not split
    assert run["satellite_micro_batches"] + run["core_micro_batches"] == policy_steps * cfg.micro_batches
    assert run["executions"] == cfg.executions
    assert run["calls_sticky"] > 0, "an execution's later calls go back to the cell that holds its KV"
    for key in INTEGRITY:
        assert run[key] == 0, key
    assert summary["config"]["learner_backend"] == "megatron"
