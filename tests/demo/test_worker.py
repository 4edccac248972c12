"""Rollout workers record exactly what the engine saw: inputs, outputs, summaries, forks, timeouts."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
import sqlalchemy as sa

from sapwood.demo.tasks import (
    FORK,
    INVALID,
    KEY_OPEN,
    MEM_OPEN,
    OK,
    PAD,
    SUM_END,
    SUM_REQ,
    WRONG,
    KeyRecallConfig,
    KeyRecallEnv,
)
from sapwood.demo.worker import ExecutionReport, RolloutWorker, run_execution
from sapwood.learner.assembly import build_batch
from sapwood.learner.batch import SUMMARY
from sapwood.learner.config import SourceConfig
from sapwood.platform import schema as t
from sapwood.platform.store import Store
from sapwood.rollout.engines import Engine, Generation, SamplingParams
from sapwood.rollout.recorder import Recorder
from sapwood.rollout.transports import InProcessTransport


class ContextReader(Engine):
    """A scripted engine that solves the task from its input alone (with a few deliberate slips).

    It finds the list in the context, counts graded turns since the list, and emits the
    next symbol; asked for a summary, it copies the rest of the list. ``slip`` makes every
    n-th action wrong; ``truncate`` drops the last symbol of every summary.
    """

    name = "context-reader"

    def __init__(self, config: KeyRecallConfig, *, slip: int = 0, truncate: bool = False, version: int = 0) -> None:
        self.config = config
        self.slip = slip
        self.truncate = truncate
        self.calls = 0
        self._version = version

    @property
    def policy_version(self) -> int:
        return self._version

    def generate(self, input_ids: Sequence[int], params: SamplingParams) -> Generation:
        ids = list(input_ids)
        start = max(i for i, x in enumerate(ids) if x in (KEY_OPEN, MEM_OPEN)) + 1
        items = []
        for x in ids[start:]:
            if not self.config.is_symbol(x):
                break
            items.append(x)
        cursor = sum(1 for x in ids[start:] if x in (OK, WRONG))
        self.calls += 1
        if ids[-1] == SUM_REQ:
            rest = items[cursor:-1] if self.truncate and len(items) > cursor + 1 else items[cursor:]
            out = [*rest, SUM_END][: params.max_new_tokens]
        else:
            nxt = items[cursor] if cursor < len(items) else PAD
            if self.slip and self.calls % self.slip == 0 and self.config.is_symbol(nxt):
                nxt = self.config.symbol((nxt - self.config.symbol(0) + 1) % self.config.n_symbols)
            out = [nxt]
        return Generation(output_ids=np.asarray(out, dtype=np.int32), logprobs=np.full(len(out), -0.5, np.float32),
                          policy_version=self._version, finish_reason="stop" if out[-1] == SUM_END else "length")


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store.open(f"sqlite:///{tmp_path / 'store.db'}")


def play(store: Store, env: KeyRecallEnv, engine: Engine, n: int, *, seed: int = 0,
         fork: bool | None = None) -> list[ExecutionReport]:
    recorder = Recorder(InProcessTransport(store), run_id="rollout", engine=engine.name,
                        vocab_size=env.config.vocab_size, task_family="key-recall")
    rng = np.random.default_rng(seed)
    reports = [run_execution(env, engine, recorder, env.sample_task(rng), rng, fork=fork, keep_calls=True)
               for _ in range(n)]
    recorder.close()
    return reports


def test_store_holds_exactly_what_the_worker_recorded(store: Store) -> None:
    env = KeyRecallEnv()
    reports = play(store, env, ContextReader(env.config, slip=5), 12)
    calls = [c for r in reports for c in r.call_log or []]
    assert len(calls) == sum(r.calls for r in reports) == store.stats()["calls"]
    for call in calls:
        assert store.reconstruct_input(call.call_id).tolist() == list(call.input_ids)
        out, lps = store.call_output(call.call_id)
        assert out.tolist() == list(call.output_ids)
        np.testing.assert_allclose(lps, call.logprobs)
    assert {c.kind for c in calls} == {"action", "summary"}
    assert store.stats()["compactions"] == sum(r.compactions for r in reports) > 0
    assert all(len(call.input_ids) + len(call.output_ids) <= env.config.context_limit for call in calls)


def test_summaries_are_trainable_and_frozen_summaries_are_not(store: Store) -> None:
    env = KeyRecallEnv()
    reports = play(store, env, ContextReader(env.config), 6, seed=1)
    ids = [r.execution_id for r in reports]
    batch, used = build_batch(store, ids, SourceConfig())
    assert used == ids
    summary = batch.role == SUMMARY
    assert int(summary.sum()) > 0
    assert bool(batch.trainable[summary].all())
    assert int((batch.segment_parent >= 0).sum()) == sum(r.compactions for r in reports)
    frozen, _ = build_batch(store, ids, SourceConfig(train_summaries=False))
    assert not bool(frozen.trainable[frozen.role == SUMMARY].any())
    assert bool(frozen.trainable[frozen.role != SUMMARY].any())


def test_timeouts_carry_partial_scores(store: Store) -> None:
    env = KeyRecallEnv(KeyRecallConfig(min_key=13, max_key=14, max_turns=12))  # longer than the turn budget
    reports = play(store, env, ContextReader(env.config, slip=4), 4, seed=2, fork=False)
    assert {r.status for r in reports} == {"timeout"}
    with store.transaction() as conn:
        rows = {r.execution_id: r for r in conn.execute(sa.select(t.executions))}
        scores = conn.execute(sa.select(t.scores.c.execution_id, t.scores.c.score, t.scores.c.components)).all()
    assert len(scores) == 4
    for r in reports:
        row = rows[r.execution_id]
        assert row.status == "timeout"
        assert row.score == pytest.approx(r.partial_score)
        assert row.reward == pytest.approx(r.partial_score)
        assert 0.0 < row.score < 1.0  # partial progress is worth something, not 0
    for _, score, components in scores:
        assert score == pytest.approx(components["slots_correct"] / components["key_slots"])


def test_forks_continue_each_branch_to_its_own_end(store: Store) -> None:
    env = KeyRecallEnv(KeyRecallConfig(fork_branches=3))
    reports = play(store, env, ContextReader(env.config, slip=3), 3, seed=3, fork=True)
    assert all(r.forks == 1 and len(r.leaf_scores) == 3 for r in reports)
    assert store.stats()["fork_points"] == 3
    batch, _ = build_batch(store, [r.execution_id for r in reports], SourceConfig(jmax=8))
    assert batch.trajectories_per_execution().tolist() == [3, 3, 3]
    batch, _ = build_batch(store, [r.execution_id for r in reports], SourceConfig(jmax=2))
    assert batch.trajectories_per_execution().tolist() == [2, 2, 2]  # Jmax bounds the branches trained
    with store.transaction() as conn:
        leaf_rewards = [r.leaf_rewards for r in conn.execute(sa.select(t.executions.c.leaf_rewards))]
    assert all(len(lr) == 3 for lr in leaf_rewards)


class ForkingReader(ContextReader):
    """A ContextReader that chooses ``FORK`` after 1 and after 3 graded turns."""

    def generate(self, input_ids: Sequence[int], params: SamplingParams) -> Generation:
        ids = list(input_ids)
        graded = sum(1 for x in ids if x in (OK, WRONG))
        if ids[-1] != SUM_REQ and ids[-4] != FORK and graded in (1, 3) and ids.count(FORK) < 4:  # action, verdict
            return Generation(output_ids=np.asarray([FORK], dtype=np.int32),
                              logprobs=np.full(1, -0.5, np.float32), policy_version=0, finish_reason="length")
        return super().generate(input_ids, params)


def test_a_fork_chosen_by_the_policy_forks_the_execution_there(store: Store) -> None:
    env = KeyRecallEnv(KeyRecallConfig(min_key=5, max_key=5, policy_forks=2, fork_prob=0.0))
    reports = play(store, env, ForkingReader(env.config), 2, seed=4)
    # Fork after turn 1 (2 branches), each branch forks again after turn 3: 3 forks, 4 trajectories.
    assert all(r.forks == 3 and len(r.leaf_scores) == 4 for r in reports)
    assert all(r.leaf_scores == [1.0] * 4 for r in reports)  # 5 symbols in 7 turns: every branch finishes
    assert store.stats()["fork_points"] == 6
    batch, _ = build_batch(store, [r.execution_id for r in reports], SourceConfig(jmax=8))
    assert batch.trajectories_per_execution().tolist() == [4, 4]
    fork_actions = (batch.tokens == FORK) & batch.trainable
    assert int(fork_actions.sum()) == 2 * 3  # the FORK actions are trained like any action
    # Each execution weighs one trajectory: 7 action turns whatever its 4 branches.
    assert batch.execution_weight().tolist() == pytest.approx([7.0, 7.0])


def test_invalid_actions_waste_turns() -> None:
    env = KeyRecallEnv()
    rng = np.random.default_rng(0)
    state = env.reset(env.sample_task(rng))
    for _ in range(env.config.max_turns):
        assert env.act(state, [PAD], rng)[0] == INVALID
    assert env.timed_out(state)
    assert env.score(state) == 0.0


def test_worker_thread_runs_until_stopped_and_respects_its_gate(store: Store) -> None:
    env = KeyRecallEnv()
    recorder = Recorder(InProcessTransport(store), run_id="rollout", vocab_size=env.config.vocab_size)
    reports: list[ExecutionReport] = []
    allowed = threading.Semaphore(5)
    worker = RolloutWorker(0, env, ContextReader(env.config), recorder, seed=0,
                           gate=lambda: allowed.acquire(blocking=False), on_report=reports.append)
    worker.start()
    deadline = 50
    while len(reports) < 5 and deadline:
        threading.Event().wait(0.1)
        deadline -= 1
    worker.stop()
    worker.join(timeout=10)
    assert not worker.is_alive()
    assert len(reports) == 5
    assert worker.waited_s > 0
    recorder.close()
    assert sum(store.stats()["executions"].values()) == 5


def test_summary_engine_serves_only_the_summaries(store: Store) -> None:
    """Swapping only the summarizer: summary calls come from another engine, with its policy version."""
    env = KeyRecallEnv()
    reports = play_two(store, env, ContextReader(env.config, version=5), ContextReader(env.config, version=0))
    calls = [c for r in reports for c in r.call_log or []]
    assert {c.policy_version for c in calls if c.kind == "summary"} == {0}
    assert {c.policy_version for c in calls if c.kind == "action"} == {5}
    assert any(c.kind == "summary" for c in calls)


def play_two(store: Store, env: KeyRecallEnv, engine: Engine, summary_engine: Engine) -> list[ExecutionReport]:
    recorder = Recorder(InProcessTransport(store), run_id="rollout", vocab_size=env.config.vocab_size)
    rng = np.random.default_rng(4)
    reports = [run_execution(env, engine, recorder, env.sample_task(rng), rng, keep_calls=True,
                             summary_engine=summary_engine) for _ in range(4)]
    recorder.close()
    return reports
