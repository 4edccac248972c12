"""A replay run of small executions on an embedded store, shared by the step-commit and crash tests."""

from __future__ import annotations

from pathlib import Path

from sapwood.platform import runs
from sapwood.platform.store import Store
from tests.support.histories import small_execution


def replay_store(path: Path, executions: int, run_id: str = "train") -> tuple[str, Store, list[str]]:
    """(url, store, execution ids) of a SQLite store at ``path`` with a replay run ``run_id`` over them."""
    url = f"sqlite:///{path}"
    store = Store.open(url)
    ids = []
    for seed in range(executions):
        w = small_execution(seed, calls=4, forks=1, segments=1)
        store.apply(w.events)
        ids.append(w.execution_id)
    with store.transaction() as conn:
        runs.create_run(conn, run_id, runs.ExecutionFilter(), kind="replay", seed=3)
    return url, store, ids
