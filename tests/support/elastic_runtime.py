"""Shared set-up of the elastic-runtime tests: a small model, a SQLite store, a started runtime."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from sapwood.demo.elastic.executions import ExecutionOutcome, run_executions
from sapwood.demo.tasks import KeyRecallConfig, KeyRecallEnv, KeyTask
from sapwood.learner.model import TinyActorCritic, TinyTransformerConfig
from sapwood.scheduler.runtime.cluster import CellSpec, ElasticRuntime, init_ray

TASK = KeyRecallConfig(min_key=4, max_key=6, max_turns=10, context_limit=48, max_summary_tokens=7, fork_prob=0.0)


@pytest.fixture(scope="module", autouse=True)
def local_ray() -> Iterator[None]:
    """One local Ray (2 CPUs) per test module that imports this fixture."""
    import ray

    init_ray(num_cpus=2)
    yield
    ray.shutdown()


def model_config() -> TinyTransformerConfig:
    return TinyTransformerConfig(vocab_size=TASK.vocab_size, d_model=16, n_heads=2, n_layers=1, d_ff=32,
                                 max_position=TASK.context_limit)


def initial_state(seed: int = 0) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    return TinyActorCritic(model_config()).state_dict()


def tasks(n: int, seed: int = 0) -> list[KeyTask]:
    env = KeyRecallEnv(TASK)
    rng = np.random.default_rng(seed)
    return [env.sample_task(rng, task_id=f"t{i}") for i in range(n)]


def start_runtime(tmp_path: Path, specs: list[CellSpec], *, decode_delay_s: float = 0.0,
                  grace_s: float = 0.0) -> ElasticRuntime:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    return ElasticRuntime(url, specs, model_config(), initial_state(), decode_delay_s=decode_delay_s,
                          grace_s=grace_s)


class Background:
    """``run_executions`` in a thread on ``hosts`` execution hosts; ``hosts_of`` (execution id → its host)
    fills as executions start."""

    def __init__(self, rt: ElasticRuntime, n: int, concurrency: int, run_id: str = "run", hosts: int = 2) -> None:
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
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "executions did not finish in time"
        if self.error is not None:
            raise self.error
        return self.outcomes
