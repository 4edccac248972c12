"""Fast paths of the API: binary outputs, JSON written without pydantic, merged concurrent cache misses."""

from __future__ import annotations

import asyncio
import threading
import time
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from sapwood.api.cache import Cached, ResponseCache
from sapwood.api.routes import cached
from sapwood.api.schemas import AuditOut, TrajectoryOut
from sapwood.platform.writer import ExecutionWriter
from tests.support.api_client import Keys, TestClient, calls_of


def test_output_bin_is_the_recorded_output_and_logprobs(client: TestClient, keys: Keys,
                                                        writers: list[ExecutionWriter]) -> None:
    for call in calls_of(writers[1])[::5]:
        r = client.get(f"/v1/calls/{call.event_id}/output.bin", headers=keys.headers("read"))
        assert r.status_code == 200
        assert r.headers["content-type"] == "application/octet-stream"
        n = int(r.headers["x-sapwood-token-count"])
        assert n == call.output_ids.size
        assert len(r.content) == 8 * n
        assert np.array_equal(np.frombuffer(r.content[:4 * n], "<i4"), call.output_ids)
        assert np.array_equal(np.frombuffer(r.content[4 * n:], "<f4"), call.output_logprobs)
        assert r.headers["x-sapwood-policy-version"] == str(call.policy_version)


def test_json_written_directly_has_the_documented_shape(client: TestClient, keys: Keys,
                                                        writers: list[ExecutionWriter]) -> None:
    """The orjson bodies validate against the response models and keep float32 log-probs exact."""
    w = writers[0]
    call = calls_of(w)[-1]
    a = client.get(f"/v1/calls/{call.event_id}/audit", headers=keys.headers("read")).json()
    AuditOut.model_validate(a)
    assert np.array_equal(np.array(a["output"]["logprobs"], dtype=np.float32), call.output_logprobs)
    traj = client.get(f"/v1/nodes/{w.leaves()[0]}/trajectory", headers=keys.headers("read")).json()
    TrajectoryOut.model_validate(traj)


def test_concurrent_misses_on_one_key_build_once() -> None:
    services: Any = SimpleNamespace(cache=ResponseCache(1 << 20))
    builds: list[int] = []
    lock = threading.Lock()

    def build() -> Cached:
        with lock:
            builds.append(1)
        time.sleep(0.2)
        return b"body", {"ETag": '"x"'}

    async def many() -> list[tuple[Cached, str]]:
        return await asyncio.gather(*(cached(services, "k", build) for _ in range(8)))

    results = asyncio.run(many())
    assert len(builds) == 1
    assert sorted(state for _, state in results) == ["coalesced"] * 7 + ["miss"]
    assert all(entry == (b"body", {"ETag": '"x"'}) for entry, _ in results)
    assert asyncio.run(cached(services, "k", build))[1] == "hit"
    assert len(builds) == 1
    assert services.cache.inflight == {}


def test_a_failed_build_fails_its_waiters_and_is_retried() -> None:
    services: Any = SimpleNamespace(cache=ResponseCache(1 << 20))
    calls = {"n": 0}

    def build() -> Cached:
        calls["n"] += 1
        time.sleep(0.1)
        if calls["n"] == 1:
            raise RuntimeError("store down")
        return b"ok", {}

    async def two() -> list[Any]:
        return await asyncio.gather(cached(services, "k", build), cached(services, "k", build),
                                    return_exceptions=True)

    first, second = asyncio.run(two())
    assert isinstance(first, RuntimeError)
    assert isinstance(second, RuntimeError)
    assert calls["n"] == 1
    assert asyncio.run(cached(services, "k", build)) == ((b"ok", {}), "miss")
    with pytest.raises(KeyError):
        services.cache.inflight["k"]
