"""Starting a local Ray: a raylet that misses Ray's fixed start window is retried, other errors are not."""

from __future__ import annotations

from typing import Any

import pytest

ray = pytest.importorskip("ray")

from sapwood.scheduler.runtime import cluster  # noqa: E402

TIMED_OUT = "The current node timed out during startup. This could happen because ..."


class FakeRay:
    """Stands in for ``ray.init`` / ``ray.shutdown``: the first ``failures`` starts raise ``error``."""

    def __init__(self, failures: int, error: str = TIMED_OUT) -> None:
        self.failures, self.error = failures, error
        self.inits: list[dict[str, Any]] = []
        self.shutdowns = 0

    def init(self, **kwargs: Any) -> None:
        self.inits.append(kwargs)
        if len(self.inits) <= self.failures:
            raise Exception(self.error)

    def shutdown(self) -> None:
        self.shutdowns += 1


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> FakeRay:
    f = FakeRay(*request.param)
    monkeypatch.setattr(cluster.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(cluster.ray, "init", f.init)
    monkeypatch.setattr(cluster.ray, "shutdown", f.shutdown)
    return f


@pytest.mark.parametrize("fake", [(cluster.LOCAL_START_ATTEMPTS - 1,)], indirect=True)
def test_a_start_that_times_out_is_retried_up_to_the_last_attempt(fake: FakeRay) -> None:
    cluster.init_ray(num_cpus=2)
    assert len(fake.inits) == cluster.LOCAL_START_ATTEMPTS
    assert fake.shutdowns == cluster.LOCAL_START_ATTEMPTS - 1
    assert fake.inits[-1]["_system_config"] == {"worker_niceness": cluster.WORKER_NICENESS}


@pytest.mark.parametrize("fake", [(cluster.LOCAL_START_ATTEMPTS,)], indirect=True)
def test_the_last_timed_out_attempt_raises(fake: FakeRay) -> None:
    with pytest.raises(Exception, match="timed out during startup"):
        cluster.init_ray(num_cpus=2)
    assert len(fake.inits) == cluster.LOCAL_START_ATTEMPTS


@pytest.mark.parametrize("fake", [(1, "some other start error")], indirect=True)
def test_another_start_error_is_raised_at_once(fake: FakeRay) -> None:
    with pytest.raises(Exception, match="some other start error"):
        cluster.init_ray(num_cpus=2)
    assert len(fake.inits) == 1
    assert fake.shutdowns == 0


@pytest.mark.parametrize("fake", [(0,)], indirect=True)
def test_joining_a_cluster_is_one_plain_init(fake: FakeRay) -> None:
    cluster.init_ray("10.0.0.1:6379", namespace="ns")
    assert fake.inits == [{"address": "10.0.0.1:6379", "log_to_driver": False, "namespace": "ns"}]
