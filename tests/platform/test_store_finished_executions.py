"""``Store.finished_executions``: what the demo waits on while ingest catches up."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from sapwood.platform.store import Store
from sapwood.rollout import InProcessTransport, Recorder


def test_counts_success_timeout_and_error_of_one_run_only(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path / 's.db'}")
    recorder = Recorder(InProcessTransport(store), run_id="a", engine="test", vocab_size=16)
    other = Recorder(InProcessTransport(store), run_id="b", engine="test", vocab_size=16)
    lp = np.array([-0.5], dtype=np.float32)
    for status in ("success", "timeout", "error"):
        with recorder.start(f"task-{status}", prompt=[1, 2]) as ex:
            ex.call([1, 2], [3], lp, policy_version=0)
            ex.finish(status, reward=0.5)
    open_ex = recorder.start("task-open", prompt=[1, 2])  # started, never finished
    open_ex.call([1, 2], [3], lp, policy_version=0)
    with other.start("task-b", prompt=[1]) as ex:
        ex.call([1], [2], lp, policy_version=0)
        ex.finish("success", reward=1.0)
    recorder.flush()
    other.flush()
    assert store.finished_executions("a") == 3
    assert store.finished_executions("b") == 1
    assert store.finished_executions("missing") == 0
    open_ex.finish("success", reward=1.0)
    recorder.flush()
    assert store.finished_executions("a") == 4
