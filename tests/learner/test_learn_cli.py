"""``sapwood learn`` trains a live run end to end on the embedded store and publishes policy versions."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from sapwood.learner.loop import latest_policy
from sapwood.platform import runs
from sapwood.platform.cli import app
from sapwood.platform.store import Store
from support.histories import small_execution


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
    assert summary["steps"] == 3 and summary["lost_claims"] == 0
    with store.transaction() as conn:
        assert runs.run_progress(conn, "train") == {"pending": 0, "claimed": 0, "done": 3}
    # the default critic warm-up (8 steps) is longer than this run: no policy update yet
    assert summary["policy_version"] == 0 and latest_policy(store, "train") is None


def test_learn_needs_an_existing_run_or_a_source(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'learn.db'}"
    result = CliRunner().invoke(app, ["learn", "--database-url", url, "--run", "nope"])
    assert result.exit_code != 0 and "does not exist" in result.output
