"""Rollout workers killed at ``rollout.after_claim`` and ``rollout.mid_recording``: after the restart every
prompt sample has exactly one finished execution, the dead worker's is abandoned and never queued."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from sapwood.platform import runs
from sapwood.platform.prompts import PromptRow, add_prompts, prompt_progress
from sapwood.platform.storage.backends import prompt_queue
from sapwood.platform.storage.learner_reads import run_item_states
from sapwood.platform.store import Store

PROMPTS, SAMPLES = 3, 2


@pytest.mark.parametrize(("point", "abandoned"), [("rollout.after_claim", 0), ("rollout.mid_recording@3", 1)])
def test_a_worker_killed_mid_sample_leaves_nothing_lost_or_doubled(tmp_path: Path, point: str,
                                                                    abandoned: int) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    store = Store.open(url)
    with store.transaction() as conn:
        runs.create_run(conn, "p", runs.ExecutionFilter(run_id="p"), kind="live")
        add_prompts(conn, "p", [PromptRow(f"q{i}", f"t{i}", "f", {}) for i in range(PROMPTS)],
                    samples_per_prompt=SAMPLES)
    args = [sys.executable, "-m", "sapwood.rollout.prompt_worker", url, "p"]
    crashed = subprocess.run([*args, "dead", "1.0", "2", "0"], env={**os.environ, "SAPWOOD_FAULT": point},
                             capture_output=True, text=True, timeout=120)
    assert crashed.returncode == -signal.SIGKILL, crashed.stdout + crashed.stderr
    # the restarted worker waits out the dead one's lease (1 s) and rolls out everything
    restarted = subprocess.run([*args, "alive", "1.0", "2", "3"], capture_output=True, text=True, timeout=120)
    assert restarted.returncode == 0, restarted.stderr
    with store.transaction() as conn:
        q = prompt_queue(conn)
        attempts = q.attempts(conn, "p")
        assert prompt_progress(conn, "p") == {0: {"pending": 0, "claimed": 0, "done": PROMPTS * SAMPLES,
                                                  "abandoned": abandoned}}
        runs.sync_run(conn, "p")
        queued = run_item_states(conn, "p")
    finished = [a for a in attempts if a["state"] == "finished"]
    every_sample = {f"{i}:0:{s}": 1 for i in range(PROMPTS) for s in range(SAMPLES)}
    assert Counter(a["sample_id"] for a in finished) == every_sample
    dead = [a for a in attempts if a["state"] == "abandoned"]
    assert [a["worker"] for a in dead] == ["dead"] * abandoned
    # the training run queues the finished executions and never the abandoned one
    assert set(queued) == {a["execution_id"] for a in finished}
