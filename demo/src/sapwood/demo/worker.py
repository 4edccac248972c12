"""Rollout workers: run executions of an environment with an engine, recorded through the TITO recorder.

:func:`run_execution` plays one execution of the key-recall family: action turns with tool
observations, compaction when the context fills (the model writes the summary, the next
segment starts from an instruction plus that summary), an optional fork (one turn
resampled k ways, each branch continuing to its own end), and a turn budget after which
the trajectory times out and the scorer's partial score becomes its reward.

:class:`RolloutWorker` is a thread that runs executions back to back with whatever policy
version its engine serves (single-rollout, no group barrier); a ``gate`` lets the caller
pause it while the learners' backlog is too large.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sapwood.demo.tasks import FORK, INVALID, SUM_END, BranchState, KeyRecallEnv, KeyTask
from sapwood.platform.events import ModelCall
from sapwood.rollout.engines import Engine, Generation, SamplingParams
from sapwood.rollout.recorder import ExecutionRecorder, Recorder

__all__ = ["ExecutionReport", "RecordedCall", "RolloutWorker", "run_execution"]

log = logging.getLogger(__name__)


@dataclass
class ExecutionReport:
    """What a worker observed while playing one execution (the store holds the full record)."""

    execution_id: str
    task_id: str
    status: str
    """``success`` / ``timeout`` / ``error``."""
    reward: float
    """Mean over the execution's trajectories of their scores (slots correct / K)."""
    leaf_scores: list[float]
    """Score of each trajectory (one per fork branch)."""
    partial_score: float | None
    """The scorer's partial score, recorded when the execution timed out."""
    calls: int = 0
    summary_calls: int = 0
    generated_tokens: int = 0
    compactions: int = 0
    forks: int = 0
    invalid_actions: int = 0
    engine_seconds: float = 0.0
    """Wall time spent inside engine calls (the rest of the execution is recording and environment)."""
    summary_recall: list[float] = field(default_factory=list)
    """Per compaction: fraction of the remaining key slots its summary kept in place."""
    policy_versions: list[int] = field(default_factory=list)
    """Version that served each call, in call order."""
    tokens_per_version: dict[int, int] = field(default_factory=dict)
    """Generated tokens per serving policy version."""
    started_at: float = 0.0
    finished_at: float = 0.0
    worker: int = 0
    call_log: list[RecordedCall] | None = None
    """Every call exactly as the engine saw it (only with ``keep_calls``; for checks against the store)."""


@dataclass(frozen=True)
class RecordedCall:
    """One engine call as the worker made it."""

    call_id: str
    kind: str
    input_ids: tuple[int, ...]
    output_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    policy_version: int


class _Episode:
    def __init__(self, env: KeyRecallEnv, engine: Engine, summary_engine: Engine, ex: ExecutionRecorder,
                 rng: np.random.Generator, temperature: float, top_p: float, report: ExecutionReport) -> None:
        c = env.config
        self.env, self.engine, self.ex, self.rng, self.report = env, engine, ex, rng, report
        self.summary_engine = summary_engine
        self.action_params = SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=1)
        self.summary_params = SamplingParams(temperature=temperature, top_p=top_p,
                                             max_new_tokens=c.max_summary_tokens, stop_token_ids=(SUM_END,))

    def _call(self, input_ids: list[int], params: SamplingParams, kind: str, head: str) -> tuple[ModelCall, Generation]:
        engine = self.summary_engine if kind == "summary" else self.engine
        t0 = time.perf_counter()
        gen = engine.generate(input_ids, params)
        self.report.engine_seconds += time.perf_counter() - t0
        call = self.ex.call(input_ids, gen.output_ids, gen.logprobs, kind=kind, policy_version=gen.policy_version,
                            finish_reason=gen.finish_reason, timings=gen.timings, sampling_params=params.to_dict(),
                            after=head)
        r = self.report
        r.calls += 1
        r.generated_tokens += int(gen.output_ids.size)
        r.policy_versions.append(gen.policy_version)
        r.tokens_per_version[gen.policy_version] = r.tokens_per_version.get(gen.policy_version, 0) + int(
            gen.output_ids.size)
        if r.call_log is not None:
            r.call_log.append(RecordedCall(call.call_id, kind, tuple(input_ids), tuple(gen.output_ids.tolist()),
                                           tuple(gen.logprobs.tolist()), gen.policy_version))
        return call, gen

    def branch(self, state: BranchState, head: str, fork_turn: int | None) -> list[tuple[str, BranchState]]:
        """Play one trajectory from ``head`` to its end; returns ``[(leaf node, final state)]`` per branch."""
        env = self.env
        while not env.finished(state):
            if env.needs_summary(state):
                call, gen = self._call(env.summary_input(state), self.summary_params, "summary", head)
                self.report.summary_calls += 1
                kept = len(state.summary_recall)
                context = env.compact(state, gen.output_ids.tolist())
                self.report.summary_recall += state.summary_recall[kept:]
                head = self.ex.compact(context, summary=call).root_node_id
                self.report.compactions += 1
                continue
            if fork_turn is not None and state.turns == fork_turn:
                return self._fork(state, head, "resample")
            call, gen = self._call(list(state.context), self.action_params, "action", head)
            obs = env.act(state, gen.output_ids.tolist(), self.rng)
            self.report.invalid_actions += int(obs[0] == INVALID)
            head = self.ex.node(self.ex.observe(obs, after=call, source="tool"))
            if obs[0] == FORK:  # the policy chose to fork: each branch samples its own next action
                return self._fork(state, head, "policy")
        return [(head, state)]

    def _fork(self, state: BranchState, head: str, reason: str) -> list[tuple[str, BranchState]]:
        k = self.env.config.fork_branches
        self.ex.fork(k, at=head, reason=reason)
        self.report.forks += 1
        leaves: list[tuple[str, BranchState]] = []
        for _ in range(k):
            leaves += self.branch(state.copy(), head, None)
        return leaves


def run_execution(
    env: KeyRecallEnv,
    engine: Engine,
    recorder: Recorder,
    task: KeyTask,
    rng: np.random.Generator,
    *,
    temperature: float = 1.0,
    top_p: float = 1.0,
    fork: bool | None = None,
    worker: int = 0,
    keep_calls: bool = False,
    run_metadata: dict[str, Any] | None = None,
    summary_engine: Engine | None = None,
) -> ExecutionReport:
    """Play and record one execution of ``task``; returns what happened.

    Args:
        fork: force (True) or forbid (False) a fork; None draws it with ``fork_prob``.
        keep_calls: keep every call's exact input/output in ``report.call_log``.
        run_metadata: extra execution metadata.
        summary_engine: serves the summary calls (default: ``engine``); e.g. a fixed older
            policy, to swap only the summarizer while actions use the newest policy.
    """
    c = env.config
    state = env.reset(task)
    do_fork = (rng.random() < c.fork_prob) if fork is None else fork
    fork_turn = int(rng.integers(1, max(2, min(task.length, c.max_turns)))) if do_fork else None
    metadata: dict[str, Any] = {"env": "key-recall", "key_length": task.length, "context_limit": c.context_limit,
                                "max_turns": c.max_turns, "worker": worker, **(run_metadata or {})}
    started = time.time()
    with recorder.start(task.task_id, prompt=state.context, metadata=metadata, sampling_params={
            "temperature": temperature, "top_p": top_p}) as ex:
        report = ExecutionReport(execution_id=ex.execution_id, task_id=task.task_id, status="running", reward=0.0,
                                 leaf_scores=[], partial_score=None, started_at=started, worker=worker,
                                 call_log=[] if keep_calls else None)
        assert ex.head is not None
        episode = _Episode(env, engine, summary_engine or engine, ex, rng, temperature, top_p, report)
        leaves = episode.branch(state, ex.head, fork_turn)
        scores = [env.score(s) for _, s in leaves]
        timed_out = [env.timed_out(s) for _, s in leaves]
        reward = float(np.mean(scores))
        report.leaf_scores = scores
        report.reward = reward
        report.status = "timeout" if any(timed_out) else "success"
        if report.status == "timeout":
            correct = sum(s.correct for _, s in leaves)
            report.partial_score = reward
            ex.score(reward, scorer="key-recall/slots-correct", note="turn budget exhausted",
                     components={"slots_correct": float(correct), "slots_graded": float(sum(s.slot for _, s in leaves)),
                                 "key_slots": float(task.length * len(leaves))})
        ex.finish(report.status, reward=reward, leaf_rewards={node: sc for (node, _), sc in zip(leaves, scores,
                                                                                              strict=True)})
    report.finished_at = time.time()
    return report


class RolloutWorker(threading.Thread):
    """Runs executions back to back until :meth:`stop` (or ``max_executions``).

    Args:
        gate: called before each execution; while it returns False the worker waits
            (e.g. the learners' backlog is too large: bounds the policy lag).
        on_report: called with each :class:`ExecutionReport` (from this thread).
    """

    def __init__(
        self,
        index: int,
        env: KeyRecallEnv,
        engine: Engine,
        recorder: Recorder,
        *,
        seed: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        gate: Callable[[], bool] | None = None,
        on_report: Callable[[ExecutionReport], None] | None = None,
        max_executions: int | None = None,
        keep_calls: bool = False,
        summary_engine: Engine | None = None,
    ) -> None:
        super().__init__(name=f"rollout-worker-{index}", daemon=True)
        self.index = index
        self.env, self.engine, self.recorder = env, engine, recorder
        self.rng = np.random.default_rng(seed)
        self.temperature, self.top_p = temperature, top_p
        self.gate = gate
        self.on_report = on_report
        self.max_executions = max_executions
        self.keep_calls = keep_calls
        self.summary_engine = summary_engine
        self.executions = 0
        self.errors: list[BaseException] = []
        self.waited_s = 0.0
        self._stop_event = threading.Event()

    def stop(self) -> None:
        self._stop_event.set()

    @property
    def stopping(self) -> bool:
        return self._stop_event.is_set()

    def run(self) -> None:
        while not self._stop_event.is_set():
            if self.max_executions is not None and self.executions >= self.max_executions:
                return
            if self.gate is not None and not self.gate():
                t0 = time.perf_counter()
                self._stop_event.wait(0.02)
                self.waited_s += time.perf_counter() - t0
                continue
            task = self.env.sample_task(self.rng)
            try:
                report = run_execution(self.env, self.engine, self.recorder, task, self.rng,
                                       temperature=self.temperature, top_p=self.top_p, worker=self.index,
                                       keep_calls=self.keep_calls, summary_engine=self.summary_engine)
            except Exception as exc:  # recorded as an error execution by the recorder's context manager
                log.exception("worker %d: execution of %s failed", self.index, task.task_id)
                self.errors.append(exc)
                if len(self.errors) >= 3:
                    return
                continue
            self.executions += 1
            if self.on_report is not None:
                self.on_report(report)
