"""The ``sapwood`` verl agent loop: runs another registered loop and records every call it makes.

Add to a verl job's config::

    actor_rollout_ref.rollout.agent.default_agent_loop=sapwood
    +sapwood.inner_agent=tool_agent          # any registered loop (default: single_turn_agent)
    +sapwood.run_id=my-run
    +sapwood.database_url=sqlite:///sapwood.db   # embedded; or +sapwood.kafka_bootstrap=host:9092

and ``import sapwood.adapters.verl.agent_loop`` where verl imports custom loops (the agent-loop config
file's ``_target_``, or a ``ray`` runtime-env module). The inner loop gets a server manager that forwards
each ``generate`` to verl's own and records the call's exact prompt ids, output ids and log-probs
(:meth:`RecordingServerManager.generate`), so what the loop returns to verl is untouched and training
proceeds as without Sapwood.

Samples of one prompt (verl's ``rollout.n``, rows sharing a ``uid``) that run in the same agent-loop
worker become branches of ONE execution: the prompt is recorded once, then a fork of degree n, and each
sample's calls continue its own branch. With :class:`~sapwood.adapters.verl.manager.SapwoodAgentLoopManager`
as verl's agent-loop manager a group is never split across workers (and each execution records verl's
step, the job's attempt and whether it is validation); without it, or with fewer groups than workers, a
split group records one execution per worker's share, tagged with the same ``uid``. The execution
finishes when every sample of the group is done, with the mean of the samples' ``reward_score`` when the
loop computed one (each branch's score is a leaf reward), unscored otherwise (verl's reward manager
scores later: ``ExecutionRecorder.score``).

Policy version: verl passes none to an agent loop; the loop records ``kwargs["sapwood_policy_version"]``
or ``kwargs["global_steps"]`` when the dataset row carries one, else step − 1 of the manager's stamp, else
:func:`set_policy_version`'s value (:func:`policy_version_of`). The ``sapwood_*`` columns are not passed on
to the inner loop.

Restarts: execution ids derive from (run, attempt, step, uid, share); a job resumed from its checkpoint is a
new attempt, so the step it re-runs records new executions beside what the killed attempt half-recorded
(those stay unfinished, so they are never trained) and no id is recorded twice.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput, _agent_loop_registry, register

from sapwood.rollout.recorder import ExecutionRecorder, Recorder

__all__ = ["RecordingServerManager", "SapwoodAgentLoop", "execution_stamp", "policy_version_of", "recorder_for",
           "set_policy_version"]

_POLICY_VERSION = 0
_RECORDERS: dict[tuple[str, str], Recorder] = {}
_GROUPS: dict[str, _Group] = {}
NAMESPACE = uuid.UUID("5a9c6f1e-2b7d-4c43-9f0e-0b1d2e3f4a5b")


def set_policy_version(version: int) -> None:
    """The weights version recorded on calls from now on (verl's global step after a weight sync)."""
    global _POLICY_VERSION
    if version < 0:
        raise ValueError(f"a policy version is ≥ 0, got {version}")
    _POLICY_VERSION = int(version)


def recorder_for(config: Any) -> Recorder:
    """One recorder per (run, store) in this process, from the job config's ``sapwood`` section."""
    section = dict(config.get("sapwood", {}) or {})
    run_id = section.get("run_id")
    if not run_id:
        raise ValueError("the sapwood agent loop needs +sapwood.run_id=<run> in the verl config")
    target = section.get("database_url") or section.get("kafka_bootstrap")
    if not target:
        raise ValueError("set +sapwood.database_url=<url> (embedded) or +sapwood.kafka_bootstrap=<host:port>")
    key = (str(run_id), str(target))
    if key not in _RECORDERS:
        if section.get("database_url"):
            from sapwood.platform.store import Store
            from sapwood.rollout.transports import InProcessTransport

            transport: Any = InProcessTransport(Store.open(str(target)), batch_size=1)
        else:
            from sapwood.rollout.transports import KafkaTransport

            transport = KafkaTransport(str(target))
        _RECORDERS[key] = Recorder(transport, run_id=str(run_id), engine="verl",
                                   task_family=str(section.get("task_family", "verl")))
    return _RECORDERS[key]


@dataclass
class _Group:
    """The execution of one prompt's samples in this worker."""

    execution: ExecutionRecorder
    prompt_node: str | None = None
    expected: int = 1
    done: int = 0
    rewards: list[float] = field(default_factory=list)
    leaf_rewards: dict[str, float] = field(default_factory=dict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class RecordingServerManager:
    """Forwards to verl's server manager and records each ``generate`` on one branch of the group."""

    def __init__(self, inner: Any, group: _Group, policy_version: int) -> None:
        self.inner, self.group, self.policy_version = inner, group, policy_version
        self.head: str | None = None
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def generate(self, *, request_id: str, prompt_ids: list[int], sampling_params: dict[str, Any],
                       **kwargs: Any) -> Any:
        """verl's ``generate``; the call is recorded once the answer is back (exact ids, no retokenizing)."""
        output = await self.inner.generate(request_id=request_id, prompt_ids=prompt_ids,
                                           sampling_params=sampling_params, **kwargs)
        ids = np.asarray(prompt_ids, dtype=np.int32)
        out = np.asarray(output.token_ids, dtype=np.int32)
        if out.size == 0:
            return output  # nothing generated (aborted before the first token): no call to record
        lps = np.asarray(output.log_probs if output.log_probs else [0.0] * out.size, dtype=np.float32)
        g = self.group
        async with g.lock:
            rec = g.execution
            if g.prompt_node is None:  # the first call of the group: its prompt, then a fork if n > 1
                g.prompt_node = rec.prompt(ids).node_id
                if g.expected > 1:
                    rec.fork(g.expected, at=g.prompt_node, reason="verl rollout.n")
            after = self.head or g.prompt_node
            params = {k: v for k, v in sampling_params.items() if isinstance(v, int | float | str | bool)}
            if not _starts_with(ids, rec.context(after)):
                # the loop re-rendered its context (not an extension of this branch's last call): the call
                # still hangs off the shared prompt with its exact ids
                after = g.prompt_node
            call = rec.call(ids, out, lps, policy_version=self.policy_version, after=after,
                            finish_reason="abort" if output.stop_reason == "aborted" else "stop",
                            sampling_params=params, timings={})
            self.head = call.output_node_id
            self.calls += 1
        return output


def execution_stamp(kwargs: dict[str, Any]) -> dict[str, Any]:
    """What the ``sapwood`` manager stamped on the row (defaults without it): step, attempt, share, validate."""
    return {"verl_step": int(kwargs.get("sapwood_step", -1)), "verl_attempt": str(kwargs.get("sapwood_attempt", "")),
            "verl_share": int(kwargs.get("sapwood_share", 0)),
            "verl_validate": bool(kwargs.get("sapwood_validate", False))}


def policy_version_of(kwargs: dict[str, Any]) -> int:
    """The weights version of a row's rollout: the row's own ``sapwood_policy_version`` / ``global_steps``,
    else step − 1 from the manager's ``sapwood_step`` (verl rolls out step s on the weights after s − 1
    updates), else :func:`set_policy_version`'s value."""
    for key in ("sapwood_policy_version", "global_steps"):
        if kwargs.get(key) is not None:
            return int(kwargs[key])
    step = int(kwargs.get("sapwood_step", -1))
    return step - 1 if step >= 1 else _POLICY_VERSION


def _starts_with(ids: np.ndarray, prefix: np.ndarray) -> bool:
    return ids.size >= prefix.size and bool(np.array_equal(ids[: prefix.size], prefix))


@register("sapwood")
class SapwoodAgentLoop(AgentLoopBase):
    """Records the calls of the loop named by ``sapwood.inner_agent`` (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if args:
            raise TypeError("verl instantiates agent loops with keyword arguments only")
        self._kwargs = kwargs
        self.inner_name = str((self.config.get("sapwood", {}) or {}).get("inner_agent", "single_turn_agent"))
        if self.inner_name == "sapwood" or self.inner_name not in _agent_loop_registry:
            raise ValueError(f"sapwood.inner_agent={self.inner_name!r} is not another registered agent loop "
                             f"(registered: {sorted(k for k in _agent_loop_registry if k != 'sapwood')})")

    def _inner(self, server_manager: Any) -> AgentLoopBase:
        import hydra

        kwargs = {**self._kwargs, "server_manager": server_manager}
        return hydra.utils.instantiate(config=_agent_loop_registry[self.inner_name], **kwargs)

    def _group(self, kwargs: dict[str, Any]) -> tuple[_Group, str]:
        uid = str(kwargs.get("uid") or kwargs.get("index") or uuid.uuid4().hex)
        stamp = execution_stamp(kwargs)
        key = f"{stamp['verl_attempt']}/{stamp['verl_step']}/{uid}/{stamp['verl_share']}"
        group = _GROUPS.get(key)
        if group is None:
            rec = recorder_for(self.config)
            extra = kwargs.get("extra_info") or {}
            task_id = str(kwargs.get("task_id") or extra.get("index", uid) if isinstance(extra, dict) else uid)
            execution_id = str(uuid.uuid5(NAMESPACE, f"{rec.run_id}/{key}"))
            execution = rec.start(task_id, task_family=str(kwargs.get("data_source") or rec.task_family),
                                  execution_id=execution_id, metadata={"verl_uid": uid, **stamp})
            size = kwargs.get("sapwood_group_size") or self.rollout_config.get("n", 1) or 1
            group = _Group(execution, expected=int(size))
            _GROUPS[key] = group
        return group, key

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        group, uid = self._group(kwargs)
        version = policy_version_of(kwargs)
        manager = RecordingServerManager(self.server_manager, group, version)
        try:
            inner_kwargs = {k: v for k, v in kwargs.items() if not k.startswith("sapwood_")}
            output: AgentLoopOutput = await self._inner(manager).run(sampling_params, **inner_kwargs)
        except BaseException as exc:
            async with group.lock:
                _GROUPS.pop(uid, None)
                if not group.execution.finished:
                    group.execution.finish("error", message=f"{type(exc).__name__}: {exc}"[:500])
            raise
        async with group.lock:
            group.done += 1
            if output.reward_score is not None and manager.head is not None:
                group.rewards.append(float(output.reward_score))
                group.leaf_rewards[manager.head] = float(output.reward_score)
            if group.done >= group.expected:
                _GROUPS.pop(uid, None)
                scored = len(group.rewards) == group.done
                leaves: dict[Any, float] | None = dict(group.leaf_rewards) if scored else None
                group.execution.finish("success", float(np.mean(group.rewards)) if scored else None,
                                       leaf_rewards=leaves)
        return output
