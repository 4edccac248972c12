"""Executions in their own actors: the agent loop and its environment never live in a cell.

:class:`ExecutionActor` plays one key-recall execution with the ordinary
:func:`~sapwood.demo.worker.run_execution`, through a :class:`RoutedEngine` whose calls go to the
:class:`~sapwood.scheduler.runtime.router.Router`; events go to the store through the
:class:`~sapwood.scheduler.runtime.store_writer.RayStoreTransport`. A role switch of any cell only
moves where the next engine call runs: the environment's state (its step counter) carries on.

:func:`run_executions` starts actors and collects their reports; an actor that dies makes its
execution end as ``error`` with the reason (recorded by the store writer), never silently missing.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import ray
from ray.exceptions import RayActorError

from sapwood.demo.tasks import BranchState, KeyRecallConfig, KeyRecallEnv, KeyTask
from sapwood.demo.worker import run_execution
from sapwood.rollout.engines import Engine, EngineError, Generation, SamplingParams
from sapwood.rollout.recorder import ExecutionRecorder, Recorder
from sapwood.scheduler.runtime.call_digest import input_digest
from sapwood.scheduler.runtime.store_writer import RayStoreTransport

__all__ = ["CountingEnv", "ExecutionActor", "ExecutionOutcome", "ExecutionPool", "RoutedEngine", "run_executions"]


class CountingEnv(KeyRecallEnv):
    """Key-recall environment that counts its steps (tool actions) and resets."""

    def __init__(self, config: KeyRecallConfig | None = None) -> None:
        super().__init__(config)
        self.steps = 0
        self.resets = 0

    def reset(self, task: KeyTask) -> BranchState:
        self.resets += 1
        return super().reset(task)

    def act(self, state: BranchState, output: list[int], rng: np.random.Generator) -> list[int]:
        self.steps += 1
        return super().act(state, output, rng)


class RoutedEngine(Engine):
    """An :class:`Engine` whose calls are served by whatever rollout cell the router picks."""

    name = "ray-router/local-torch"

    def __init__(self, router: Any, *, on_call: Callable[[dict[str, Any]], None] | None = None,
                 decode_scale: float = 1.0, session: str | None = None) -> None:
        self.router = router
        self.session = session
        self.decode_scale = decode_scale
        self._version = 0
        self.on_call = on_call

    @property
    def policy_version(self) -> int:
        return self._version

    def generate(self, input_ids: Sequence[int], params: SamplingParams) -> Generation:
        body = params.to_dict()
        if self.decode_scale != 1.0:
            body["decode_scale"] = self.decode_scale
        if self.session is not None:
            body["session"] = self.session  # sticky cell and KV reuse across the execution's calls
        ids = [int(t) for t in input_ids]
        res = ray.get(self.router.generate.remote(ids, body))
        if res.get("status") != "ok":
            raise EngineError(f"router could not serve the call: {res.get('reason')}")
        if res.get("input_digest") != input_digest(ids):
            raise EngineError(f"cell {res.get('cell_id')} answered for other input ids than this call's "
                              f"({len(ids)} tokens); refusing to record it")
        if self.on_call is not None:
            self.on_call(res)
        self._version = int(res["policy_version"])
        timings = dict(res["timings"])
        timings["attempts"] = float(len(res["attempts"]) + 1)
        timings["continued_tokens"] = float(res.get("continued_tokens", 0))
        timings["version_changed"] = float(bool(res.get("version_changed", False)))
        return Generation(output_ids=res["output_ids"], logprobs=res["logprobs"], policy_version=self._version,
                          finish_reason=res["finish_reason"], timings=timings)


class _NamedRecorder(Recorder):
    """A recorder whose next execution gets a given id (the supervisor must know it before it starts)."""

    execution_id: str = ""

    def start(self, task_id: str, **kw: Any) -> ExecutionRecorder:
        kw.setdefault("execution_id", self.execution_id)
        return super().start(task_id, **kw)


@dataclass
class ExecutionOutcome:
    """How one execution ended, as the supervisor saw it."""

    execution_id: str
    task_id: str
    status: str
    reward: float = 0.0
    steps: int = 0
    resets: int = 0
    calls: int = 0
    rerouted_calls: int = 0
    message: str = ""
    started_at: float = 0.0
    finished_at: float = 0.0
    cells: dict[str, int] | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@ray.remote(num_cpus=0, max_restarts=0)
class ExecutionActor:
    """Owns one execution: its environment, agent loop and recorder (start it with ``max_concurrency=2``
    so :meth:`progress` answers while :meth:`play` runs)."""

    def __init__(self, execution_id: str, task: KeyTask, task_config: KeyRecallConfig, router: Any, writer: Any,
                 *, run_id: str, seed: int, temperature: float = 1.0, fork: bool | None = False,
                 metadata: dict[str, Any] | None = None, decode_scale: float = 1.0) -> None:
        self.execution_id, self.task, self.seed = execution_id, task, seed
        self.env = CountingEnv(task_config)
        self.calls = 0
        self.rerouted = 0
        self.cells: dict[str, int] = {}
        self.engine = RoutedEngine(router, on_call=self._on_call, decode_scale=decode_scale,
                                   session=execution_id)
        self.recorder = _NamedRecorder(RayStoreTransport(writer, execution_id=execution_id), run_id=run_id,
                                       engine=self.engine.name, vocab_size=task_config.vocab_size,
                                       task_family="key-recall")
        self.recorder.execution_id = execution_id
        self.temperature, self.fork = temperature, fork
        self.metadata = dict(metadata or {})

    def _on_call(self, res: dict[str, Any]) -> None:
        self.calls += 1
        self.rerouted += int(bool(res["attempts"]))
        cid = str(res.get("cell_id", "?"))
        self.cells[cid] = self.cells.get(cid, 0) + 1

    def play(self) -> dict[str, Any]:
        """Play the execution to its end; returns an :class:`ExecutionOutcome` as a dict."""
        t0 = time.time()
        rng = np.random.default_rng(self.seed)
        status, reward, message = "error", 0.0, ""
        try:
            report = run_execution(self.env, self.engine, self.recorder, self.task, rng, temperature=self.temperature,
                                   fork=self.fork, run_metadata=self.metadata)
            status, reward = report.status, report.reward
        except Exception as exc:  # the recorder's context manager recorded it as an error execution
            message = f"{type(exc).__name__}: {exc}"
        self.recorder.flush()
        return ExecutionOutcome(self.execution_id, self.task.task_id, status, reward, self.env.steps,
                                self.env.resets, self.calls, self.rerouted, message, t0, time.time(),
                                dict(self.cells)).to_json()

    def progress(self) -> dict[str, int]:
        """Environment steps and resets, engine calls so far (callable while :meth:`play` runs)."""
        return {"steps": self.env.steps, "resets": self.env.resets, "calls": self.calls}


class ExecutionPool:
    """Starts execution actors and collects how they ended (non-blocking: :meth:`poll`).

    An actor that dies ends its execution as ``error``: the store writer records
    ``execution_finished`` with the reason.
    """

    def __init__(self, task_config: KeyRecallConfig, router: Any, writer: Any, *, run_id: str, seed: int,
                 temperature: float = 1.0, metadata: dict[str, Any] | None = None) -> None:
        self.task_config, self.router, self.writer = task_config, router, writer
        self.run_id, self.seed, self.temperature, self.metadata = run_id, seed, temperature, metadata
        self.running: dict[Any, tuple[str, KeyTask, Any]] = {}
        self.started = 0

    def start(self, task: KeyTask, *, decode_scale: float = 1.0) -> tuple[str, Any]:
        """Start one execution of ``task``; returns ``(execution_id, actor)``."""
        eid = str(uuid.uuid4())
        cls = ExecutionActor.options(max_concurrency=2)  # type: ignore[attr-defined]
        actor = cls.remote(eid, task, self.task_config, self.router, self.writer, run_id=self.run_id,
                           seed=self.seed * 1_000_003 + self.started, temperature=self.temperature,
                           metadata=self.metadata, decode_scale=decode_scale)
        self.started += 1
        self.running[actor.play.remote()] = (eid, task, actor)
        return eid, actor

    def poll(self, timeout_s: float | None = None) -> list[ExecutionOutcome]:
        """Outcomes of the executions that ended (waits up to ``timeout_s`` for the first; None: forever)."""
        if not self.running:
            return []
        done, _ = ray.wait(list(self.running), num_returns=1, timeout=timeout_s)
        if done:
            done, _ = ray.wait(list(self.running), num_returns=len(self.running), timeout=0)
        out = []
        for ref in done:
            eid, task, actor = self.running.pop(ref)
            try:
                outcome = ExecutionOutcome(**ray.get(ref))
            except RayActorError as exc:
                reason = f"execution actor lost: {type(exc).__name__}: {str(exc).splitlines()[0][:500]}"
                ray.get(self.writer.finish_lost.remote(eid, reason, run_id=self.run_id, task_id=task.task_id))
                outcome = ExecutionOutcome(eid, task.task_id, "error", message=reason, finished_at=time.time())
            else:
                ray.kill(actor)
            out.append(outcome)
        return out


def run_executions(tasks: Sequence[KeyTask], task_config: KeyRecallConfig, router: Any, writer: Any, *,
                   run_id: str, seed: int, concurrency: int, temperature: float = 1.0,
                   on_started: Callable[[str, Any], None] | None = None,
                   on_finished: Callable[[ExecutionOutcome], None] | None = None,
                   metadata: dict[str, Any] | None = None) -> list[ExecutionOutcome]:
    """Play ``tasks`` with at most ``concurrency`` execution actors alive at once.

    ``on_started(execution_id, actor)`` lets a caller watch (or kill) an actor.
    """
    pool = ExecutionPool(task_config, router, writer, run_id=run_id, seed=seed, temperature=temperature,
                         metadata=metadata)
    queue = list(tasks)
    outcomes: list[ExecutionOutcome] = []
    while queue or pool.running:
        while queue and len(pool.running) < concurrency:
            eid, actor = pool.start(queue.pop(0))
            if on_started is not None:
                on_started(eid, actor)
        for outcome in pool.poll():
            outcomes.append(outcome)
            if on_finished is not None:
                on_finished(outcome)
    return outcomes
