"""The router's logic as a plain object (no Ray): least-loaded routing, re-issue of lost attempts, reroute plans."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from ray.exceptions import RayActorError

from sapwood.scheduler.runtime.router import Router

Answer = Callable[[str, list[int]], dict[str, Any]]


class _Method:
    def __init__(self, fn: Answer) -> None:
        self.fn = fn

    def remote(self, key: str, input_ids: list[int], params: dict[str, Any]) -> Any:
        async def call() -> dict[str, Any]:
            await asyncio.sleep(0)
            return self.fn(key, input_ids)

        return call()


class FakeCell:
    """Stands in for a cell actor handle: ``generate.remote(...)`` answers with ``answer``; records the calls."""

    def __init__(self, cell_id: str, answer: Answer | None = None) -> None:
        self.cell_id = cell_id
        self.calls: list[tuple[str, list[int]]] = []

        def ok(key: str, ids: list[int]) -> dict[str, Any]:
            return {"status": "ok", "output_ids": [9], "cell_id": cell_id}

        def record(key: str, ids: list[int]) -> dict[str, Any]:
            self.calls.append((key, ids))
            return (answer or ok)(key, ids)

        self.generate = _Method(record)


def dead(key: str, ids: list[int]) -> dict[str, Any]:
    raise RayActorError()


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_a_call_goes_to_a_rollout_cell_and_comes_back_with_no_attempts() -> None:
    router = Router()
    a, b = FakeCell("a"), FakeCell("b")
    router.add_cell("a", a, 2, "rollout")
    router.add_cell("b", b, 2, "train")
    res = run(router.generate([1, 2], {}))
    assert res["status"] == "ok"
    assert res["attempts"] == []
    assert [ids for _, ids in a.calls] == [[1, 2]]
    assert b.calls == [], "a training cell gets no call"
    assert router.stats()["calls"] == 1
    assert router.stats()["rerouted"] == 0


def test_an_aborted_attempt_is_reissued_with_the_same_input_ids_elsewhere() -> None:
    router = Router()

    def abort_and_switch(key: str, ids: list[int]) -> dict[str, Any]:  # a switch moves a out of rollout
        router.set_role("a", "train")
        router.set_role("b", "rollout")
        return {"status": "aborted", "reason": "switch", "discarded_tokens": 3}

    aborting, other = FakeCell("a", abort_and_switch), FakeCell("b")
    router.add_cell("a", aborting, 1, "rollout")
    router.add_cell("b", other, 1, "idle")
    done = run(router.generate([7, 8, 9], {}))
    assert done["status"] == "ok"
    assert done["cell_id"] == "b"
    assert [x["cell_id"] for x in done["attempts"]] == ["a"]
    assert other.calls[0][1] == aborting.calls[0][1] == [7, 8, 9]
    assert other.calls[0][0] == aborting.calls[0][0], "the re-issued attempt is the same logical call"
    stats = router.stats()
    assert stats["aborted"] == 1
    assert stats["rerouted"] == 1
    assert stats["discarded_tokens"] == 3


def test_a_dead_cell_is_marked_lost_and_never_picked_again() -> None:
    router = Router()
    router.add_cell("a", FakeCell("a", dead), 4, "rollout")
    router.add_cell("b", FakeCell("b"), 1, "rollout")
    router.load["b"] = 1  # b is busy: the first attempt goes to a, which dies
    task_result: dict[str, Any] = {}

    async def scenario() -> None:
        t = asyncio.ensure_future(router.generate([1], {}))
        while "a" not in router.lost:
            await asyncio.sleep(0)
        router.load["b"] = 0
        router._changed.set()
        task_result.update(await t)

    run(scenario())
    assert task_result["status"] == "ok"
    assert task_result["cell_id"] == "b"
    assert task_result["attempts"][0]["status"] == "lost"
    assert "a" in router.stats()["lost_cells"]
    assert router.stats()["cell_lost"] == 1
    assert "a" not in router._eligible()


def test_no_free_cell_is_an_error_after_the_timeout() -> None:
    router = Router(no_cell_timeout_s=0.0)
    router.add_cell("a", FakeCell("a"), 1, "idle")
    res = run(router.generate([1], {}))
    assert res["status"] == "error"
    assert "no rollout cell had a free slot" in res["reason"]


def test_reroute_plans_spread_aborted_calls_over_the_least_loaded_other_cells() -> None:
    router = Router()
    for cid, cap in (("src", 2), ("x", 2), ("y", 4)):
        router.add_cell(cid, FakeCell(cid), cap, "rollout")
    router.load.update({"src": 2, "x": 1, "y": 0})
    plan = router.plan_reroute(["k1", "k2", "k3"], "src")
    assert "src" not in plan.values()
    assert sorted(plan.values(), key=str) == ["x", "y", "y"]
    assert router.pending_reroute == {"k1", "k2", "k3"}
    assert not run(router.wait_rerouted(["k1"], timeout_s=0.0))
    router.pending_reroute.discard("k1")
    assert run(router.wait_rerouted(["k1"], timeout_s=0.0))
