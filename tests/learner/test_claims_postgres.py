"""Concurrent learners on PostgreSQL: a run is consumed exactly once; a killed learner's claim is taken over."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from sapwood.learner.claims import BatchSource
from sapwood.learner.config import SourceConfig
from sapwood.platform import runs
from sapwood.platform.store import Store
from tests.support.histories import small_execution

pytestmark = pytest.mark.postgres


def _populate(url: str, n: int) -> None:
    store = Store.open(url)
    for seed in range(n):
        store.apply(small_execution(seed, calls=6, forks=1, segments=2).events)
    with store.transaction() as conn:
        runs.create_run(conn, "run", runs.ExecutionFilter(run_id="synthetic"))
    store.close()


def test_three_concurrent_learners_never_share_an_execution(pg_url: str) -> None:
    _populate(pg_url, 24)
    claimed: dict[str, list[str]] = {}
    errors: list[BaseException] = []

    def learner(name: str) -> None:
        store = Store.open(pg_url, migrate=False)
        src = BatchSource(store, "run", learner_id=name, config=SourceConfig(executions_per_batch=2))
        try:
            while (got := src.next_batch()) is not None:
                claimed.setdefault(name, []).extend(got.execution_ids)
                time.sleep(0.01)  # "train"
                assert got.complete() == []
        except BaseException as exc:  # surfaced below
            errors.append(exc)
        finally:
            store.close()

    threads = [threading.Thread(target=learner, args=(f"L{i}",)) for i in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    assert not errors, errors
    everything = [e for ids in claimed.values() for e in ids]
    assert len(everything) == 24, "each execution claimed exactly once"
    assert len(set(everything)) == 24, "each execution claimed exactly once"
    assert len(claimed) >= 2, "the work was actually shared"
    store = Store.open(pg_url, migrate=False)
    with store.transaction() as conn:
        assert runs.run_progress(conn, "run") == {"pending": 0, "claimed": 0, "done": 24}


def test_killed_learners_claim_is_taken_over(pg_url: str) -> None:
    _populate(pg_url, 4)
    script = textwrap.dedent(f"""
        import sys, time
        from sapwood.learner.claims import BatchSource
        from sapwood.learner.config import SourceConfig
        from sapwood.platform.store import Store
        src = BatchSource(Store.open({pg_url!r}, migrate=False), "run", learner_id="doomed",
                          config=SourceConfig(executions_per_batch=2, lease_s=2.0))
        got = src.next_batch()
        print(",".join(got.execution_ids), flush=True)
        time.sleep(600)  # killed while "training"
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            env={**os.environ})
    try:
        assert proc.stdout is not None
        doomed = proc.stdout.readline().strip().split(",")
        assert len(doomed) == 2
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    store = Store.open(pg_url, migrate=False)
    survivor = BatchSource(store, "run", learner_id="survivor", config=SourceConfig(executions_per_batch=10))
    first = survivor.next_batch()
    assert first is not None, "leases still held"
    assert not set(first.execution_ids) & set(doomed), "leases still held"
    assert first.complete() == []
    time.sleep(2.5)  # the doomed learner's lease expires
    second = survivor.next_batch()
    assert second is not None
    assert sorted(second.execution_ids) == sorted(doomed)
    assert second.complete() == []
    with store.transaction() as conn:
        assert runs.run_progress(conn, "run") == {"pending": 0, "claimed": 0, "done": 4}
    store.close()
