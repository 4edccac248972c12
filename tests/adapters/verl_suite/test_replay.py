"""A replay run's batches for verl, exactly once across a verl restart (state_dict is the commit point)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sapwood.adapters.verl.replay import ReplayBatches
from sapwood.platform import runs
from sapwood.platform.store import Store
from tests.support.verl_trees import record_group


def _store(tmp_path: Path, executions: int) -> tuple[Store, list[str]]:
    store = Store.open(f"sqlite:///{tmp_path / 'store.db'}")
    ids = [record_group(store, "rec", f"t{i}", samples=2, turns=1, seed=i)[0] for i in range(executions)]
    with store.transaction() as conn:
        runs.create_run(conn, "replay", runs.ExecutionFilter(run_id="rec"), kind="replay", seed=0)
    return store, ids


def _ids(proto) -> list[str]:  # type: ignore[no-untyped-def]
    return list(proto.meta_info["sapwood"]["execution_ids"])


def test_a_restart_trains_what_the_lost_steps_trained_once_and_nothing_twice(tmp_path: Path) -> None:
    store, ids = _store(tmp_path, 6)
    first = ReplayBatches(store, "replay", prompt_length=16, response_length=16, executions_per_batch=2)
    it = iter(first)
    committed = _ids(next(it)) + _ids(next(it))
    state = first.state_dict()  # verl saved the weights after two steps, then the loader's state
    lost = _ids(next(it))  # a third step trained, then the job died before its checkpoint
    assert state == {"holder": "verl:replay", "run_id": "replay", "committed_batches": 2}
    with store.transaction() as conn:
        assert runs.run_progress(conn, "replay") == {"pending": 0, "claimed": 2, "done": 4}

    resumed = ReplayBatches(store, "replay", prompt_length=16, response_length=16, executions_per_batch=2)
    resumed.load_state_dict(state)
    after = [e for proto in resumed for e in _ids(proto)]
    assert sorted(lost) == sorted(after[: len(lost)])  # the lost step is trained again, first
    lineage = committed + after
    assert sorted(lineage) == sorted(ids)  # every execution in the surviving lineage exactly once
    resumed.state_dict()
    with store.transaction() as conn:
        assert runs.run_progress(conn, "replay") == {"pending": 0, "claimed": 0, "done": 6}


def test_a_state_of_another_run_is_refused(tmp_path: Path) -> None:
    store, _ = _store(tmp_path, 1)
    loader = ReplayBatches(store, "replay", prompt_length=8, response_length=8)
    with pytest.raises(ValueError, match="state is for run 'other'"):
        loader.load_state_dict({"run_id": "other", "holder": "h", "committed_batches": 0})
