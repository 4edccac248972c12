"""A local Ray started by the runtime runs its workers (cells, execution hosts) at normal priority."""

from __future__ import annotations

import os

import pytest

ray = pytest.importorskip("ray")

from sapwood.scheduler.runtime.cluster import WORKER_NICENESS  # noqa: E402
from tests.support.elastic_runtime import local_ray  # noqa: E402, F401


@ray.remote(num_cpus=0)
def _niceness() -> int:
    return os.nice(0)


@ray.remote(num_cpus=0)
class _Probe:
    def niceness(self) -> int:
        return os.nice(0)


def test_tasks_and_actors_run_at_the_runtime_niceness_not_rays_default() -> None:
    assert WORKER_NICENESS == 0
    assert ray.get(_niceness.remote()) == WORKER_NICENESS  # Ray's own default is 15
    probe = _Probe.remote()  # type: ignore[attr-defined]
    assert ray.get(probe.niceness.remote()) == WORKER_NICENESS
