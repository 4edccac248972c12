"""Shared set-up of the elastic-runtime tests: a local Ray per module, a started runtime (the task, the model and
the background executions are the product's, :mod:`sapwood.demo.elastic.small_runtime`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sapwood.demo.elastic.small_runtime import TASK, Background, initial_state, model_config, tasks
from sapwood.scheduler.runtime.cluster import CellSpec, ElasticRuntime, init_ray

__all__ = ["TASK", "Background", "fresh_ray", "initial_state", "local_ray", "model_config", "start_runtime", "tasks"]


@pytest.fixture(scope="module", autouse=True)
def local_ray() -> Iterator[None]:
    """One local Ray (2 CPUs) per test module that imports this fixture."""
    import ray

    init_ray(num_cpus=2)
    yield
    ray.shutdown()


@pytest.fixture()
def fresh_ray() -> Iterator[None]:
    """No Ray running before the test (the demo starts its own) and none after it."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
    yield
    ray.shutdown()


def start_runtime(tmp_path: Path, specs: list[CellSpec], *, decode_delay_s: float = 0.0,
                  grace_s: float = 0.0) -> ElasticRuntime:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    return ElasticRuntime(url, specs, model_config(), initial_state(), decode_delay_s=decode_delay_s,
                          grace_s=grace_s)
