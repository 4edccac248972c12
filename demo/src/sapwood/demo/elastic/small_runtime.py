"""A small elastic runtime's pieces, shared by the crash rounds of the chaos campaign and the runtime tests:
the key-recall task it plays, its tiny model, and executions played in a background thread."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import torch

from sapwood.demo.elastic.executions import ExecutionOutcome, run_executions
from sapwood.demo.tasks import KeyRecallConfig, KeyRecallEnv, KeyTask
from sapwood.learner.model import TinyActorCritic, TinyTransformerConfig

__all__ = ["TASK", "Background", "initial_state", "model_config", "tasks"]

TASK = KeyRecallConfig(min_key=4, max_key=6, max_turns=10, context_limit=48, max_summary_tokens=7, fork_prob=0.0)


def model_config() -> TinyTransformerConfig:
    """The tiny actor-critic every cell serves (one layer, ``d_model`` 16, :data:`TASK`'s vocabulary)."""
    return TinyTransformerConfig(vocab_size=TASK.vocab_size, d_model=16, n_heads=2, n_layers=1, d_ff=32,
                                 max_position=TASK.context_limit)


def initial_state(seed: int = 0) -> dict[str, torch.Tensor]:
    """The model's initial weights for ``seed``."""
    torch.manual_seed(seed)
    return TinyActorCritic(model_config()).state_dict()


def tasks(n: int, seed: int = 0) -> list[KeyTask]:
    """``n`` key-recall tasks ``t0`` … drawn with ``seed``."""
    env = KeyRecallEnv(TASK)
    rng = np.random.default_rng(seed)
    return [env.sample_task(rng, task_id=f"t{i}") for i in range(n)]


class Background:
    """``run_executions`` of ``n`` tasks in a thread on ``hosts`` execution hosts; ``hosts_of`` (execution id →
    its host) fills as executions start."""

    def __init__(self, rt: Any, n: int, concurrency: int, run_id: str = "run", hosts: int = 2) -> None:
        self.hosts_of: dict[str, Any] = {}
        self.outcomes: list[ExecutionOutcome] = []
        self.error: BaseException | None = None

        def target() -> None:
            try:
                self.outcomes = run_executions(tasks(n), TASK, rt.router, rt.writer, run_id=run_id, seed=0,
                                               concurrency=concurrency, hosts=hosts,
                                               on_started=self.hosts_of.__setitem__)
            except BaseException as exc:
                self.error = exc

        self.thread = threading.Thread(target=target, daemon=True)
        self.thread.start()

    def join(self, timeout: float = 240.0) -> list[ExecutionOutcome]:
        """The outcomes, once every execution ended; raises what the thread raised, or if it outlasts ``timeout``."""
        self.thread.join(timeout)
        if self.thread.is_alive():
            raise TimeoutError(f"executions did not finish within {timeout:.0f} s")
        if self.error is not None:
            raise self.error
        return self.outcomes
