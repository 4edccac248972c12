"""Prompt queue contract: samples leased once, re-issued after a dead worker's lease with its execution
abandoned (never trained), done when the execution finished; the same on SQLite and PostgreSQL."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from sapwood.platform import runs
from sapwood.platform.errors import UnknownParentError, ValidationError
from sapwood.platform.prompts import PromptRow, add_prompts, prompt_progress
from sapwood.platform.storage.backends import prompt_queue
from sapwood.platform.store import Store
from sapwood.platform.writer import ExecutionWriter

T0 = 1_000.0
LEASE = 10.0


def _run(store: Store, prompts: int = 3, *, samples: int = 2, epochs: int = 2) -> None:
    with store.transaction() as conn:
        runs.create_run(conn, "p", runs.ExecutionFilter(run_id="rollouts"), kind="live")
        rows = [PromptRow(prompt=f"question {i}", task_id=f"t{i}", task_family="math", metadata={"i": i})
                for i in range(prompts)]
        assert add_prompts(conn, "p", rows, samples_per_prompt=samples, epochs=epochs) == prompts * samples * epochs


def _execution(store: Store, *, finish: bool) -> str:
    w = ExecutionWriter(run_id="rollouts", task_id="t")
    w.start()
    w.prompt([1, 2, 3])
    if finish:
        w.finish("success", reward=1.0)
    store.apply(w.events)
    return w.execution_id


def test_epochs_are_claimed_in_order_and_every_sample_once(store: Store) -> None:
    _run(store)
    q = prompt_queue(store.engine.connect())
    with store.transaction() as conn:
        first = q.claim(conn, "p", "w1", 6, lease_s=LEASE, now=T0)
        second = q.claim(conn, "p", "w2", 100, lease_s=LEASE, now=T0)
        assert [s.epoch for s in first] == [0] * 6
        assert [s.epoch for s in second] == [1] * 6
        ids = [s.sample_id for s in first + second]
        assert len(set(ids)) == 12
        assert {s.prompt for s in first} == {"question 0", "question 1", "question 2"}
        assert first[0].task_family == "math"
        assert first[0].attempt == 1
        assert first[0].lease_until == T0 + LEASE
        assert q.claim(conn, "p", "w3", 1, lease_s=LEASE, now=T0 + LEASE) == []  # at the boundary the lease holds
        assert prompt_progress(conn, "p") == {0: {"pending": 0, "claimed": 6, "done": 0, "abandoned": 0},
                                              1: {"pending": 0, "claimed": 6, "done": 0, "abandoned": 0}}


def test_a_sample_is_done_when_its_execution_finished_in_the_store(store: Store) -> None:
    _run(store, 1, samples=1, epochs=1)
    q = prompt_queue(store.engine.connect())
    with store.transaction() as conn:
        (s,) = q.claim(conn, "p", "w1", 1, lease_s=LEASE, now=T0)
    running = _execution(store, finish=False)
    with store.transaction() as conn:
        assert q.attach(conn, "p", "w1", s.sample_id, running, now=T0)
        assert not q.attach(conn, "p", "w2", s.sample_id, running, now=T0), "w2 does not hold it"
        assert q.progress(conn, "p", now=T0)[0]["claimed"] == 1  # recording: not done yet
    finished = _execution(store, finish=True)  # the worker's next attempt, recorded to the end
    with store.transaction() as conn:
        q.release(conn, "p", "w1", [s.sample_id])  # (the running attempt is abandoned on release)
        (again,) = q.claim(conn, "p", "w1", 1, lease_s=LEASE, now=T0)
        assert again.sample_id == s.sample_id
        assert again.attempt == 2
        assert q.attach(conn, "p", "w1", s.sample_id, finished, now=T0)
        assert q.progress(conn, "p", now=T0 + 100) == {0: {"pending": 0, "claimed": 0, "done": 1, "abandoned": 1}}
        # a lease that ends after the sample is done re-issues nothing
        assert q.claim(conn, "p", "w2", 1, lease_s=LEASE, now=T0 + 100) == []


def test_a_dead_workers_sample_is_reissued_and_its_execution_abandoned_never_trained(store: Store) -> None:
    _run(store, 1, samples=1, epochs=1)
    q = prompt_queue(store.engine.connect())
    with store.transaction() as conn:
        (s,) = q.claim(conn, "p", "dead", 1, lease_s=LEASE, now=T0)
    w = ExecutionWriter(run_id="rollouts", task_id="t")
    w.start()
    w.prompt([1, 2, 3])
    w.finish("success", reward=1.0)
    store.apply(w.events[:-1])  # the worker dies mid-recording: its last event is still in flight
    half = w.execution_id
    with store.transaction() as conn:
        assert q.attach(conn, "p", "dead", s.sample_id, half, now=T0)
        assert q.claim(conn, "p", "w2", 1, lease_s=LEASE, now=T0 + LEASE) == []
        (again,) = q.claim(conn, "p", "w2", 1, lease_s=LEASE, now=T0 + LEASE + 0.001)
        assert again.sample_id == s.sample_id
        assert q.renew(conn, "p", "dead", [s.sample_id], lease_s=LEASE, now=T0 + 11) == 0
        assert {a["execution_id"]: a["state"] for a in q.attempts(conn, "p")} == {half: "abandoned"}
    store.apply(w.events[-1:])  # the half-recorded execution's last event lands late: still never trained
    with store.transaction() as conn:
        runs.create_run(conn, "train", runs.ExecutionFilter(run_id="rollouts"), kind="replay")
        assert runs.run_progress(conn, "train")["pending"] == 0
        assert q.progress(conn, "p", now=T0 + 12)[0] == {"pending": 0, "claimed": 1, "done": 0, "abandoned": 1}


def test_concurrent_workers_never_share_a_sample(store: Store) -> None:
    _run(store, 10, samples=2, epochs=1)

    def worker(name: str) -> list[str]:
        got = []
        while True:
            with store.transaction() as conn:
                claimed = prompt_queue(conn).claim(conn, "p", name, 1, lease_s=600.0)
            if not claimed:
                return got
            got.append(claimed[0].sample_id)

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(worker, ["a", "b", "c", "d"]))
    flat = [s for r in results for s in r]
    assert len(flat) == 20
    assert len(set(flat)) == 20


def test_prompts_need_a_run_and_valid_counts(store: Store) -> None:
    row = PromptRow(prompt="x", task_id="t", task_family="f", metadata={})
    with store.transaction() as conn, pytest.raises(UnknownParentError):
        add_prompts(conn, "missing", [row])
    _run(store, 1, samples=1, epochs=1)
    with store.transaction() as conn, pytest.raises(ValidationError, match="≥ 1"):
        add_prompts(conn, "p", [row], samples_per_prompt=0)
