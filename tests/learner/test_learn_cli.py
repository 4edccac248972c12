"""``sapwood learn`` trains a live run end to end on the embedded store and publishes policy versions."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from sapwood.learner.loop import latest_policy
from sapwood.platform import runs
from sapwood.platform.cli import app
from sapwood.platform.store import Store
from tests.support.histories import small_execution


def test_learn_consumes_a_live_run_and_publishes(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'learn.db'}"
    store = Store.open(url)
    for seed in range(3):
        store.apply(small_execution(seed, calls=6, forks=1, segments=2, status="timeout" if seed else "success").events)
    result = CliRunner().invoke(app, [
        "learn", "--database-url", url, "--run", "train", "--source-run", "synthetic", "--max-steps", "5",
        "--idle-timeout", "0.5", "--executions-per-batch", "1", "--checkpoint-dir", str(tmp_path / "ckpt"),
        "--threads", "1",
    ])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output.strip().splitlines()[-1])
    assert summary["steps"] == 3
    assert summary["lost_claims"] == 0
    with store.transaction() as conn:
        # the default critic warm-up (8 steps) is longer than this run: no policy update, so nothing was
        # committed and the learner gave its claims back on exit (a restart retrains them from the start)
        assert runs.run_progress(conn, "train") == {"pending": 3, "claimed": 0, "done": 0}
    assert summary["policy_version"] == 0
    assert latest_policy(store, "train") is None


def test_learn_needs_an_existing_run_or_a_source(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'learn.db'}"
    result = CliRunner().invoke(app, ["learn", "--database-url", url, "--run", "nope"])
    assert result.exit_code != 0
    assert "does not exist" in result.output


def test_learn_with_the_megatron_backend_publishes_tiny_layout_checkpoints_and_resumes(tmp_path: Path) -> None:

    from tests.support.megatron_ranks import require_megatron

    require_megatron()
    import torch

    from sapwood.learner.megatron_parallel import teardown_parallel
    from sapwood.learner.model import TinyActorCritic, TinyTransformerConfig
    from sapwood.rollout.engines import load_model_state

    url = f"sqlite:///{tmp_path / 'learn.db'}"
    store = Store.open(url)
    for seed in range(10):
        store.apply(small_execution(seed, calls=4, forks=1, segments=1).events)
    args = ["learn", "--database-url", url, "--run", "train", "--source-run", "synthetic", "--idle-timeout", "0.5",
            "--executions-per-batch", "1", "--checkpoint-dir", str(tmp_path / "ckpt"), "--threads", "1",
            "--backend", "megatron"]
    try:
        result = CliRunner().invoke(app, [*args, "--max-steps", "9"])
        assert result.exit_code == 0, result.output
        summary = json.loads(result.output.strip().splitlines()[-1])
        # 8 critic warm-up steps, then one joint step: policy version 1, published with its checkpoint
        assert summary["backend"] == "megatron"
        assert summary["steps"] == 9
        assert summary["policy_version"] == 1
        published = latest_policy(store, "train")
        assert published is not None
        assert published[0] == 1
        state = torch.load(published[1], weights_only=False)["backend"]
        assert state["backend_kind"] == "megatron"
        assert state["policy_version"] == 1
        tiny = TinyActorCritic(TinyTransformerConfig(vocab_size=state["model"]["actor.tok.weight"].shape[0]))
        tiny.load_state_dict(load_model_state(published[1]))  # what the rollout engine serves
        # a second run resumes from that checkpoint and trains the last execution
        result = CliRunner().invoke(app, [*args, "--max-steps", "5"])
        assert result.exit_code == 0, result.output
        assert "resumed from policy version 1" in result.output
        again = json.loads(result.output.strip().splitlines()[-1])
        # the checkpoint holds the critic warm-up count: the resumed trainer goes on with a joint step
        assert again["steps"] == 1
        assert again["policy_version"] == 2
    finally:
        teardown_parallel()
    bad = CliRunner().invoke(app, [*args, "--backend", "jax"])
    assert bad.exit_code != 0
    assert "--backend must be one of torch, megatron" in bad.output


def test_learn_refuses_jmax_below_one(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'learn.db'}"
    result = CliRunner().invoke(app, ["learn", "--database-url", url, "--run", "r", "--jmax", "0"])
    assert result.exit_code == 2, result.output
    assert "jmax must be >= 1" in result.output
