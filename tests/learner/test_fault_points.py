"""Kill -9 at each learner fault point in a real ``sapwood learn`` process; the restart loses and
duplicates nothing (checked from the store alone by the exactly-once audit)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sapwood.learner.audit import audit_training
from sapwood.platform import runs
from sapwood.platform.cli import app
from sapwood.platform.faults import FAULT_POINTS, armed_point, fault_point
from sapwood.platform.storage.learner_reads import policy_history
from tests.support.replay_store import replay_store

EXECUTIONS = 5


def _learn_args(url: str, ckpt: Path) -> list[str]:
    return ["learn", "--database-url", url, "--run", "train", "--executions-per-batch", "1", "--threads", "1",
            "--checkpoint-dir", str(ckpt), "--critic-warmup-steps", "1", "--lease-s", "1.0",
            "--checkpoint-grace-s", "0", "--idle-timeout", "5", "--max-steps", "20"]


@pytest.mark.parametrize(("point", "hit"), [
    ("learner.after_step", 3),  # warm-up, version 1 committed, then killed before checkpointing version 2
    ("learner.after_checkpoint", 2),  # version 2's checkpoint renamed into place, never published
    ("learner.in_commit", 2),  # version 2's claims marked done inside the transaction that never commits
])
def test_a_learner_killed_at_a_fault_point_restarts_without_loss_or_duplicates(
        tmp_path: Path, point: str, hit: int) -> None:
    url, store, _ = replay_store(tmp_path / "s.db", EXECUTIONS)
    ckpt = tmp_path / "ck"
    env = {**os.environ, "SAPWOOD_FAULT": f"{point}@{hit}"}
    crashed = subprocess.run([sys.executable, "-c", "from sapwood.platform.cli import main; main()",
                              *_learn_args(url, ckpt)], env=env, capture_output=True, text=True, timeout=300)
    assert crashed.returncode == -signal.SIGKILL, crashed.stdout + crashed.stderr
    with store.transaction() as conn:
        assert [v for v, _, _ in policy_history(conn, "train")] == [1]
        assert runs.run_progress(conn, "train")["done"] == 2  # warm-up + version 1; the rest never committed
    left = sorted(p.name for p in ckpt.glob("policy-v*.pt"))
    if point == "learner.after_step":
        assert len(left) == 1  # only version 1's
    else:
        assert len(left) == 2
        assert left[1].startswith("policy-v000002-")  # written, unpublished

    # The restart waits out the dead learner's lease (1 s), resumes from version 1 and trains the rest.
    restarted = CliRunner().invoke(app, _learn_args(url, ckpt))
    assert restarted.exit_code == 0, restarted.output
    assert "resumed from policy version 1" in restarted.output
    audit = audit_training(store, "train")
    assert audit.ok, audit
    assert audit.trained == EXECUTIONS
    assert audit.versions == [1, 2, 3, 4]  # 1 warm-up batch + 4 updates
    with store.transaction() as conn:
        assert runs.run_progress(conn, "train") == {"pending": 0, "claimed": 0, "done": EXECUTIONS}
        published = {p for _, p, _ in policy_history(conn, "train")}
    assert {str(p) for p in ckpt.glob("policy-v*.pt")} == published  # the orphan was removed (grace 0)


def test_fault_point_names_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SAPWOOD_FAULT", "learner.nowhere")
    with pytest.raises(ValueError, match=r"unknown fault point 'learner\.nowhere'"):
        armed_point()
    monkeypatch.setenv("SAPWOOD_FAULT", "learner.after_step@0")
    with pytest.raises(ValueError, match="integer ≥ 1"):
        armed_point()
    monkeypatch.setenv("SAPWOOD_FAULT", "learner.after_step@2")
    assert armed_point() == ("learner.after_step", 2)
    with pytest.raises(ValueError, match="unknown fault point"):
        fault_point("typo")
    monkeypatch.delenv("SAPWOOD_FAULT")
    for name in FAULT_POINTS:
        fault_point(name)  # unarmed: returns
