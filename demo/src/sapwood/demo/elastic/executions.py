"""Executions on execution hosts: the agent loops and their environments never live in a cell.

An :class:`ExecutionHost` is a long-lived actor (a few per run, started once) that plays many
key-recall executions at once, each a :class:`HostedExecution`: the ordinary
:func:`~sapwood.demo.worker.run_execution` through a :class:`RoutedEngine` whose calls go to the
:class:`~sapwood.scheduler.runtime.router.Router`, events batched to the store through the
:class:`~sapwood.scheduler.runtime.store_writer.RayStoreTransport`. No torch is imported in a host
(the model runs in the cells), so a host starts in a fraction of a cell's start-up, and no
execution pays a process start. A role switch of any cell only moves where the next engine call
runs: the environment's state (its step counter) carries on.

:class:`ExecutionPool` spreads executions over its hosts and collects their reports; a host that
dies makes each of its executions end as ``error`` with the reason (recorded by the store writer),
never silently missing.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
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

__all__ = ["CountingEnv", "ExecutionHost", "ExecutionOutcome", "ExecutionPool", "HostedExecution", "RoutedEngine",
           "run_executions"]


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
    event_rpcs: int = 0
    host_id: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class HostedExecution:
    """One execution inside a host: its environment, agent loop (the ordinary :func:`run_execution`),
    routed engine and recorder (events batched ``event_batch`` to one store-writer RPC)."""

    def __init__(self, execution_id: str, task: KeyTask, task_config: KeyRecallConfig, router: Any, writer: Any,
                 *, run_id: str, seed: int, temperature: float = 1.0, fork: bool | None = False,
                 metadata: dict[str, Any] | None = None, decode_scale: float = 1.0, event_batch: int = 32,
                 task_family: str = "key-recall") -> None:
        self.execution_id, self.task, self.seed = execution_id, task, seed
        self.env = CountingEnv(task_config)
        self.calls = 0
        self.rerouted = 0
        self.cells: dict[str, int] = {}
        self.engine = RoutedEngine(router, on_call=self._on_call, decode_scale=decode_scale,
                                   session=execution_id)
        self.transport = RayStoreTransport(writer, execution_id=execution_id, batch_size=event_batch)
        self.recorder = _NamedRecorder(self.transport, run_id=run_id, engine=self.engine.name,
                                       vocab_size=task_config.vocab_size, task_family=task_family)
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
                                dict(self.cells), self.transport.rpcs).to_json()

    def progress(self) -> dict[str, int]:
        return {"steps": self.env.steps, "resets": self.env.resets, "calls": self.calls}


@ray.remote(num_cpus=0, max_restarts=0)
class ExecutionHost:
    """A long-lived actor that plays many executions at once (start it with ``max_concurrency`` ≥
    ``max_executions`` + a few, so :meth:`progress` and :meth:`info` answer while executions play).

    Each :meth:`play` is an asyncio task on the host's event loop; the agent loop itself is the
    ordinary synchronous :func:`run_execution`, so each runs on a thread of the host's pool of
    ``max_executions`` (its engine calls wait on the router there). This module imports no torch: the
    host process never loads it (:meth:`info` reports ``torch_imported``).
    """

    def __init__(self, host_id: str, task_config: KeyRecallConfig, router: Any, writer: Any, *, run_id: str,
                 temperature: float = 1.0, metadata: dict[str, Any] | None = None, max_executions: int = 64,
                 event_batch: int = 32, task_family: str = "key-recall") -> None:
        self.host_id, self.task_config, self.router, self.writer = host_id, task_config, router, writer
        self.run_id, self.temperature, self.metadata = run_id, temperature, dict(metadata or {})
        self.event_batch, self.task_family = event_batch, task_family
        self.threads = ThreadPoolExecutor(max_executions, thread_name_prefix=f"host-{host_id}")
        self.live: dict[str, HostedExecution] = {}
        self.played = 0
        self.most_at_once = 0

    async def play(self, execution_id: str, task: KeyTask, *, seed: int, decode_scale: float = 1.0) -> dict[str, Any]:
        """Play one execution of ``task`` to its end; returns its :class:`ExecutionOutcome` as a dict."""
        ex = HostedExecution(execution_id, task, self.task_config, self.router, self.writer, run_id=self.run_id,
                             seed=seed, temperature=self.temperature, metadata=self.metadata,
                             decode_scale=decode_scale, event_batch=self.event_batch, task_family=self.task_family)
        self.live[execution_id] = ex
        self.most_at_once = max(self.most_at_once, len(self.live))
        try:
            out = await asyncio.get_running_loop().run_in_executor(self.threads, ex.play)
        finally:
            del self.live[execution_id]
            self.played += 1
        return {**out, "host_id": self.host_id}

    async def progress(self, execution_id: str) -> dict[str, int] | None:
        """Environment steps and resets, engine calls so far; None once the execution has ended here."""
        ex = self.live.get(execution_id)
        return None if ex is None else ex.progress()

    async def info(self) -> dict[str, Any]:
        """``host_id``, ``pid``, ``torch_imported``, executions ``played`` / ``running`` / ``most_at_once``."""
        return {"host_id": self.host_id, "pid": os.getpid(), "torch_imported": "torch" in sys.modules,
                "played": self.played, "running": len(self.live), "most_at_once": self.most_at_once}


class ExecutionPool:
    """Plays executions on ``hosts`` long-lived :class:`ExecutionHost` actors (the least busy host takes the
    next one) and collects how they ended (non-blocking: :meth:`poll`); :meth:`close` ends the hosts.

    An execution whose host dies ends as ``error``: the store writer records ``execution_finished``
    with the reason.
    """

    def __init__(self, task_config: KeyRecallConfig, router: Any, writer: Any, *, run_id: str, seed: int,
                 temperature: float = 1.0, metadata: dict[str, Any] | None = None, hosts: int = 2,
                 per_host: int = 64, event_batch: int = 32, task_family: str = "key-recall") -> None:
        if hosts < 1:
            raise ValueError(f"hosts must be ≥ 1, got {hosts}")
        self.task_config, self.router, self.writer = task_config, router, writer
        self.run_id, self.seed = run_id, seed
        cls = ExecutionHost.options(max_concurrency=per_host + 8)  # type: ignore[attr-defined]
        self.hosts: list[Any] = [cls.remote(f"h{i}", task_config, router, writer, run_id=run_id,
                                            temperature=temperature, metadata=metadata, max_executions=per_host,
                                            event_batch=event_batch, task_family=task_family)
                                 for i in range(hosts)]
        self.busy = [0] * hosts
        self.running: dict[Any, tuple[str, KeyTask, int]] = {}
        self.started = 0

    def ready(self) -> list[dict[str, Any]]:
        """Wait until every host is up; returns their :meth:`ExecutionHost.info`."""
        return list(ray.get([h.info.remote() for h in self.hosts]))

    def start(self, task: KeyTask, *, decode_scale: float = 1.0) -> tuple[str, Any]:
        """Start one execution of ``task`` on the least busy host; returns ``(execution_id, host)``."""
        eid = str(uuid.uuid4())
        i = min(range(len(self.hosts)), key=lambda j: self.busy[j])
        ref = self.hosts[i].play.remote(eid, task, seed=self.seed * 1_000_003 + self.started,
                                        decode_scale=decode_scale)
        self.started += 1
        self.busy[i] += 1
        self.running[ref] = (eid, task, i)
        return eid, self.hosts[i]

    def poll(self, timeout_s: float | None = None) -> list[ExecutionOutcome]:
        """Outcomes of the executions that ended (waits up to ``timeout_s`` for the first; None: forever)."""
        if not self.running:
            return []
        done, _ = ray.wait(list(self.running), num_returns=1, timeout=timeout_s)
        if done:
            done, _ = ray.wait(list(self.running), num_returns=len(self.running), timeout=0)
        out = []
        for ref in done:
            eid, task, i = self.running.pop(ref)
            self.busy[i] -= 1
            try:
                outcome = ExecutionOutcome(**ray.get(ref))
            except RayActorError as exc:
                reason = f"execution host lost: {type(exc).__name__}: {str(exc).splitlines()[0][:500]}"
                ray.get(self.writer.finish_lost.remote(eid, reason, run_id=self.run_id, task_id=task.task_id))
                outcome = ExecutionOutcome(eid, task.task_id, "error", message=reason, finished_at=time.time(),
                                           host_id=f"h{i}")
            out.append(outcome)
        return out

    def close(self) -> None:
        """End the hosts (executions still playing on them are lost)."""
        for h in self.hosts:
            ray.kill(h)


def run_executions(tasks: Sequence[KeyTask], task_config: KeyRecallConfig, router: Any, writer: Any, *,
                   run_id: str, seed: int, concurrency: int, temperature: float = 1.0, hosts: int = 2,
                   on_started: Callable[[str, Any], None] | None = None,
                   on_finished: Callable[[ExecutionOutcome], None] | None = None,
                   metadata: dict[str, Any] | None = None) -> list[ExecutionOutcome]:
    """Play ``tasks`` on ``hosts`` execution hosts, at most ``concurrency`` executions at once.

    ``on_started(execution_id, host)`` lets a caller watch an execution (``host.progress.remote(id)``)
    or kill its host.
    """
    pool = ExecutionPool(task_config, router, writer, run_id=run_id, seed=seed, temperature=temperature,
                         metadata=metadata, hosts=hosts)
    queue = list(tasks)
    outcomes: list[ExecutionOutcome] = []
    try:
        while queue or pool.running:
            while queue and len(pool.running) < concurrency:
                eid, host = pool.start(queue.pop(0))
                if on_started is not None:
                    on_started(eid, host)
            for outcome in pool.poll():
                outcomes.append(outcome)
                if on_finished is not None:
                    on_finished(outcome)
    finally:
        pool.close()
    return outcomes
