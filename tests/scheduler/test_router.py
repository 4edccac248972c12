"""The router's logic as a plain object (no Ray): least-loaded routing, re-issue of lost attempts, reroute plans."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from ray.exceptions import RayActorError

from sapwood.scheduler.runtime.call_digest import input_digest
from sapwood.scheduler.runtime.router import Router

Answer = Callable[[str, list[int]], dict[str, Any]]


class _Method:
    def __init__(self, fn: Callable[[str, list[int], dict[str, Any]], dict[str, Any]]) -> None:
        self.fn = fn

    def remote(self, key: str, input_ids: list[int], params: dict[str, Any]) -> Any:
        async def call() -> dict[str, Any]:
            await asyncio.sleep(0)
            return self.fn(key, input_ids, params)

        return call()


class FakeCell:
    """Stands in for a cell actor handle: ``generate.remote(...)`` answers with ``answer``; records the calls."""

    def __init__(self, cell_id: str, answer: Answer | None = None, version: int = 0) -> None:
        self.cell_id = cell_id
        self.calls: list[tuple[str, list[int]]] = []
        self.params: list[dict[str, Any]] = []

        def ok(key: str, ids: list[int]) -> dict[str, Any]:
            return {"status": "ok", "output_ids": [9], "logprobs": [-0.5], "cell_id": cell_id,
                    "policy_version": version, "input_digest": input_digest(ids)}

        def record(key: str, ids: list[int], params: dict[str, Any]) -> dict[str, Any]:
            self.calls.append((key, ids))
            self.params.append(params)
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


def aborting(router: Router, partial: list[int], version: int = 0) -> Answer:
    """A cell's answer when a switch moves it (a) out of rollout and b in, after ``partial`` tokens."""

    def answer(key: str, ids: list[int]) -> dict[str, Any]:
        router.set_role("a", "train")
        router.set_role("b", "rollout")
        return {"status": "aborted", "reason": "switch", "output_ids": partial, "logprobs": [-1.0] * len(partial),
                "policy_version": version, "input_digest": input_digest(ids), "cell_id": "a"}

    return answer


def _aborting_pair() -> tuple[Router, FakeCell, FakeCell]:
    """A router over rollout cell ``a``, whose call is aborted after tokens [5, 6], and idle cell ``b``."""
    router = Router()
    source = FakeCell("a")
    source.generate = FakeCell("a", aborting(router, [5, 6])).generate
    other = FakeCell("b")
    router.add_cell("a", source, 1, "rollout")
    router.add_cell("b", other, 1, "idle")
    return router, source, other


def test_an_aborted_call_continues_elsewhere_from_its_partial_output() -> None:
    router, _source, other = _aborting_pair()
    done = run(router.generate([7, 8, 9], {"max_new_tokens": 4}))
    assert done["status"] == "ok"
    assert done["cell_id"] == "b"
    assert [x["cell_id"] for x in done["attempts"]] == ["a"]
    assert other.calls[0][1] == [7, 8, 9, 5, 6], "the continuation is fed input + partial output"
    assert other.params[0]["max_new_tokens"] == 2, "with the remaining token budget"
    assert done["output_ids"].tolist() == [5, 6, 9]
    assert done["logprobs"].tolist() == [-1.0, -1.0, -0.5]
    assert done["input_digest"] == input_digest([7, 8, 9]), "one call, on the original input"
    assert done["continued_tokens"] == 2
    assert done["version_changed"] is False
    stats = router.stats()
    assert stats["aborted"] == 1
    assert stats["rerouted"] == 1
    assert stats["continued_tokens"] == 2


def test_a_call_continued_on_newer_weights_keeps_its_start_version_and_says_so() -> None:
    router = Router()
    source = FakeCell("a")
    source.generate = FakeCell("a", aborting(router, [5], version=3)).generate
    router.add_cell("a", source, 1, "rollout")
    router.add_cell("b", FakeCell("b", version=4), 1, "idle")
    done = run(router.generate([7], {"max_new_tokens": 3}))
    assert done["policy_version"] == 3
    assert done["policy_versions"] == [3, 4]
    assert done["version_changed"] is True
    assert router.stats()["version_changed"] == 1


def test_a_call_aborted_after_its_last_token_is_complete() -> None:
    router, _source, other = _aborting_pair()
    done = run(router.generate([7], {"max_new_tokens": 2}))
    assert done["output_ids"].tolist() == [5, 6]
    assert other.calls == []


def test_an_answer_for_other_input_ids_is_an_error() -> None:
    router = Router()
    router.add_cell("a", FakeCell("a", lambda k, ids: {"status": "ok", "input_digest": input_digest([0])}), 1,
                    "rollout")
    res = run(router.generate([1, 2], {}))
    assert res["status"] == "error"
    assert "other input ids" in res["reason"]


def test_a_session_sticks_to_its_cell_while_it_is_in_rollout() -> None:
    router = Router()
    a, b = FakeCell("a"), FakeCell("b")
    router.add_cell("a", a, 4, "rollout")
    router.add_cell("b", b, 4, "rollout")
    run(router.generate([1], {"session": "e"}))
    first = "a" if a.calls else "b"
    router.load[first] = 3  # busier than the other cell, still a free slot
    run(router.generate([1, 9, 2], {"session": "e"}))
    assert len((a if first == "a" else b).calls) == 2
    assert router.stats()["sticky"] == 1


def _prefilled(prefill_s: float, tokens: int) -> Answer:
    """An answer that recomputed a whole context of ``tokens`` tokens in ``prefill_s`` seconds."""
    def ok(key: str, ids: list[int]) -> dict[str, Any]:
        return {"status": "ok", "output_ids": [9], "logprobs": [-0.5], "policy_version": 0,
                "input_digest": input_digest(ids),
                "timings": {"prefill_s": prefill_s, "prefill_tokens": tokens, "cached_tokens": 0}}
    return ok


def _sticky_pair(router: Router, answer: Answer) -> tuple[FakeCell, FakeCell]:
    """Two one-slot rollout cells; session ``e`` served once (on the first), then its cell made full."""
    a, b = FakeCell("a", answer), FakeCell("b", answer)
    router.add_cell("a", a, 1, "rollout")
    router.add_cell("b", b, 1, "rollout")
    run(router.generate([1], {"session": "e"}))
    assert len(a.calls) == 1
    router.load["a"] = 1  # another call holds the sticky cell's only slot
    return a, b


def test_a_short_context_leaves_its_full_sticky_cell_rather_than_idle_a_free_one() -> None:
    """Recomputing 3 tokens at the measured 0.1 ms per token costs 0.3 ms: the call moves instead of
    waiting (here the cap is a day, and no cell frees: the old unbounded wait ended in "no free slot")."""
    router = Router(sticky_wait_s=86_400.0, no_cell_timeout_s=5.0)
    a, b = _sticky_pair(router, _prefilled(0.001, 10))
    assert router.prefill_s_per_token == pytest.approx(1e-4)
    assert router.sticky_wait(3) == pytest.approx(3e-4)
    res = run(router.generate([1, 9, 2], {"session": "e"}))
    assert res["status"] == "ok", res
    assert (len(a.calls), len(b.calls)) == (1, 1)
    assert router.stats()["sticky_left"] == 1


def test_a_context_costlier_to_recompute_waits_for_its_sticky_cell() -> None:
    """At 10 s per token, 3 tokens would take 30 s to recompute: the call waits for its own cell's slot."""
    router = Router(sticky_wait_s=60.0, no_cell_timeout_s=120.0)
    a, b = _sticky_pair(router, _prefilled(100.0, 10))
    assert router.sticky_wait(3) == 30.0

    async def scenario() -> dict[str, Any]:
        task = asyncio.ensure_future(router.generate([1, 9, 2], {"session": "e"}))
        while router.waiting == 0 and not task.done():
            await asyncio.sleep(0)
        router.load["a"] = 0  # the sticky cell's slot frees while the call waits
        router._changed.set()
        return await task

    assert run(scenario())["status"] == "ok"
    assert (len(a.calls), len(b.calls)) == (2, 0)
    assert router.stats()["sticky_left"] == 0


def test_the_prefill_rate_comes_from_whole_context_recomputations_only() -> None:
    router = Router(sticky_wait_s=2.0)
    assert router.sticky_wait(10**6) == 2.0, "no rate measured yet: the cap"
    router._learn_prefill({"prefill_s": 0.01, "prefill_tokens": 10, "cached_tokens": 0})
    assert router.prefill_s_per_token == 1e-3
    assert router.sticky_wait(2000) == 2.0, "2000 tokens × 1 ms: exactly the cap"
    assert router.sticky_wait(1999) < 2.0
    for ignored in ({"prefill_s": 5.0, "prefill_tokens": 10, "cached_tokens": 1},  # a cached prefix
                    {"prefill_s": 5.0, "prefill_tokens": 10},  # a cell that does not say
                    {"prefill_s": 5.0, "prefill_tokens": 0, "cached_tokens": 0},
                    {"prefill_s": float("nan"), "prefill_tokens": 10, "cached_tokens": 0},
                    {"prefill_s": -1.0, "prefill_tokens": 10, "cached_tokens": 0}, {}):
        router._learn_prefill(ignored)
        assert router.prefill_s_per_token == 1e-3, ignored
    router._learn_prefill({"prefill_s": 0.02, "prefill_tokens": 10, "cached_tokens": 0})
    assert router.prefill_s_per_token == pytest.approx(0.8e-3 + 0.2 * 2e-3)  # PREFILL_EWMA = 0.2
    assert router.sticky_wait(1000) == pytest.approx(1.2)
    assert router.sticky_wait(2000) == 2.0, "never past the cap"
    assert router.sticky_wait(0) == 0.0


def test_a_reroute_hint_to_a_full_cell_is_queued_not_dropped() -> None:
    router = Router()
    for cid in ("x", "y"):
        router.add_cell(cid, FakeCell(cid), 1, "rollout")
    router.load.update({"x": 1, "y": 1})
    hinted = str(router.plan_reroute(["k"], "src")["k"])
    assert router.reserved[hinted] == 1
    other = "y" if hinted == "x" else "x"
    router.load[other] = 0  # the other cell frees first: the hinted call keeps waiting for its target
    result: dict[str, Any] = {}

    async def scenario() -> None:
        task = asyncio.ensure_future(router._pick("k", None))
        for _ in range(20):
            await asyncio.sleep(0.001)
        assert not task.done(), "the router waits for the hinted cell"
        router.load[hinted] = 0
        assert await router._pick("new", None) == other, "a new call does not take the slot reserved there"
        router._changed.set()
        result["cell"] = await task

    run(scenario())
    assert result["cell"] == hinted
    assert router.reserved[hinted] == 0


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


def test_the_queue_counts_calls_waiting_for_a_slot_and_occupied_slots() -> None:
    router = Router()
    router.add_cell("a", FakeCell("a"), 1, "rollout")
    router.add_cell("b", FakeCell("b"), 2, "train")
    router.load["a"] = 1  # a's one slot is in use: new calls wait
    seen: dict[str, Any] = {}

    async def scenario() -> None:
        waiting = [asyncio.ensure_future(router.generate([i], {})) for i in range(3)]
        for _ in range(1000):  # the three calls reach the router's wait for a slot within a few loop turns
            if router.waiting >= 3:
                break
            await asyncio.sleep(0)
        seen["full"] = router.queue()
        router.load["a"] = 0
        router._changed.set()
        await asyncio.gather(*waiting)
        seen["drained"] = router.queue()

    run(scenario())
    assert seen["full"] == {"waiting": 3, "occupied": {"a": 1}}, "a train cell's slots are no rollout occupancy"
    assert seen["drained"] == {"waiting": 0, "occupied": {"a": 0}}


class FakeClock:
    """``time.monotonic`` for the router, advanced only by the cells' answers (seconds)."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now


def test_session_times_split_each_sessions_wait_for_a_slot_from_its_time_holding_one(
        monkeypatch: Any) -> None:
    import sapwood.scheduler.runtime.router as router_module

    clock = FakeClock()
    monkeypatch.setattr(router_module, "time", clock)
    router = Router()
    cost = {"A": 2.0, "B": 0.5}  # seconds each session's call keeps the cell busy

    def busy(key: str, ids: list[int]) -> dict[str, Any]:
        clock.now += cost["A" if ids == [1] else "B"]
        return {"status": "ok", "output_ids": [9], "logprobs": [-0.5], "cell_id": "a", "policy_version": 0,
                "input_digest": input_digest(ids)}

    router.add_cell("a", FakeCell("a", busy), 1, "rollout")  # one slot: B waits while A holds it

    async def scenario() -> None:
        await asyncio.gather(router.generate([1], {"session": "A"}), router.generate([2], {"session": "B"}),
                             router.generate([3], {}))

    run(scenario())
    times = router.session_times()
    assert sorted(times) == ["A", "B"], "a call with no session is counted for no session"
    assert times["A"] == {"waited_s": 0.0, "held_s": 2.0}
    assert times["B"]["waited_s"] == 2.0, "B waited while A held the only slot"
    assert times["B"]["held_s"] == 0.5
