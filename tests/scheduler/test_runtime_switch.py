"""A role switch with calls in flight, and cells or executions killed mid-run (local Ray, SQLite store)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

ray = pytest.importorskip("ray")

from sapwood.scheduler.runtime.cluster import CellSpec  # noqa: E402
from tests.support.elastic_runtime import Background, start_runtime  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def local_ray() -> Iterator[None]:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _wait(cond, timeout: float = 60.0, what: str = "condition") -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def _progress(actor) -> dict[str, int] | None:  # type: ignore[no-untyped-def]
    """An execution actor's progress, or None once it has ended (the pool kills a finished execution's actor)."""
    try:
        return dict(ray.get(actor.progress.remote()))
    except ray.exceptions.RayActorError:
        return None


def _calling_or_ended(bg: Background, n: int) -> bool:
    """All ``n`` executions started, and each has made an engine call or has already ended (a loaded machine
    starts actor processes slowly: the first execution may finish before the last one's process is up)."""
    if len(bg.actors) < n:
        return False
    states = [_progress(a) for a in list(bg.actors.values())]
    return all(s is None or s["calls"] > 0 for s in states)


def _in_flight(rt, cell_id: str) -> int:  # type: ignore[no-untyped-def]
    return int(ray.get(rt.cells[cell_id].status.remote())["in_flight"])


def test_switch_with_calls_in_flight_loses_and_duplicates_none(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # 0.15 s per token keeps a call in flight long enough to be caught by the switch (abort, not grace)
    rt = start_runtime(tmp_path, [CellSpec("c0", capacity=2), CellSpec("c1", capacity=2)], decode_delay_s=0.15)
    try:
        bg = Background(rt, n=4, concurrency=4)
        _wait(lambda: _calling_or_ended(bg, 4), what="four executions calling (or ended)")
        _wait(lambda: _in_flight(rt, "c0") > 0, what="calls in flight on c0")
        before = {eid: p for eid, a in list(bg.actors.items()) if (p := _progress(a)) is not None}
        report = rt.assign("c0", "train", reason="test")
        assert report.aborted_calls >= 1, report
        assert {"drain", "grace", "abort", "kv_handoff", "reroute", "weight_load"} <= set(report.phases)
        outcomes = bg.join()
        stats = ray.get(rt.router.stats.remote())
        assert stats["aborted"] >= report.aborted_calls
        assert stats["rerouted"] >= report.aborted_calls
        in_store = rt.call_counts()
        assert len(outcomes) == 4
        for o in outcomes:
            assert o.status in ("success", "timeout"), o
            assert o.resets == 1  # the environment was never reset by the switch
            # and its step counter went on from where it was (an execution that ended before the switch has none)
            assert o.steps >= before.get(o.execution_id, {"steps": 0})["steps"]
            row = in_store[o.execution_id]
            assert row.calls == o.calls == row.distinct_seq  # every completed call once, none lost
            assert row.actions == o.steps  # one recorded action call per environment step
        assert sum(o.steps for o in outcomes if o.execution_id in before) > sum(p["steps"] for p in before.values())
        assert sum(o.rerouted_calls for o in outcomes) == report.aborted_calls
        served = {o.execution_id: o.cells or {} for o in outcomes}
        after_switch = ray.get(rt.cells["c0"].status.remote())
        assert after_switch["role"] == "train"
        assert after_switch["in_flight"] == 0
        assert sum(c.get("c1", 0) for c in served.values()) > 0
        assert rt.switch_phases("c0") == set(report.phases)
        assert rt.cell_roles()["c0"] == "train"
        assert {e: x.status for e, x in rt.executions().items()} == {o.execution_id: o.status for o in outcomes}
    finally:
        rt.shutdown()


def test_killed_cell_calls_are_reissued_and_no_execution_is_lost(tmp_path) -> None:  # type: ignore[no-untyped-def]
    rt = start_runtime(tmp_path, [CellSpec("c0", capacity=2), CellSpec("c1", capacity=2)], decode_delay_s=0.03)
    try:
        bg = Background(rt, n=3, concurrency=3)
        _wait(lambda: _in_flight(rt, "c0") > 0, what="calls in flight on c0")
        ray.kill(rt.cells["c0"])
        outcomes = bg.join()
        stats = ray.get(rt.router.stats.remote())
        assert "c0" in stats["lost_cells"]
        assert stats["cell_lost"] >= 1
        assert [o.status in ("success", "timeout") for o in outcomes] == [True] * 3
        in_store = rt.call_counts()
        for o in outcomes:
            assert in_store[o.execution_id].calls == o.calls
        assert sum(o.rerouted_calls for o in outcomes) >= 1
    finally:
        rt.shutdown()


def test_killed_execution_actor_ends_as_error_with_reason(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # 0.1 s per token: an execution that has just made its first call is seconds away from its end
    rt = start_runtime(tmp_path, [CellSpec("c0", capacity=2)], decode_delay_s=0.1)
    try:
        bg = Background(rt, n=2, concurrency=2)
        victims: list[str] = []

        def one_calling() -> bool:  # the victim: an execution that is alive, has called, and is far from its end
            for eid, actor in sorted(bg.actors.items()):
                p = _progress(actor)
                if p is not None and p["calls"] > 0 and p["steps"] <= 2:
                    victims.append(eid)
                    return True
            return False

        _wait(one_calling, what="an execution calling in its first steps")
        victim = victims[0]
        ray.kill(bg.actors[victim])
        outcomes = {o.execution_id: o for o in bg.join()}
        assert outcomes[victim].status == "error"
        assert "execution actor lost" in outcomes[victim].message
        other = next(e for e in outcomes if e != victim)
        assert outcomes[other].status in ("success", "timeout")
        rows = rt.executions()
        assert rows[victim].status == "error"
        assert "execution actor lost" in rows[victim].message
        assert rows[other].status in ("success", "timeout")
    finally:
        rt.shutdown()


class _ParkFirstCell:
    """Test policy: moves c0 to idle, leaves every other cell where it is."""

    name = "park-c0"

    def initial_assignment(self, cell_ids):  # type: ignore[no-untyped-def]
        return dict.fromkeys(cell_ids, "rollout")

    def decide(self, signals, assignment):  # type: ignore[no-untyped-def]
        from sapwood.scheduler.policy import Decision

        target = dict(assignment)
        target["c0"] = "idle"
        return Decision(target=target, reasons={"c0": "test: park c0"})


def test_ray_actuator_moves_a_cell_from_the_live_loop(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from sapwood.scheduler.live_loop import SchedulerLoop
    from sapwood.scheduler.runtime.actuator import RayActuator
    from sapwood.scheduler.runtime.cluster import ElasticRuntime
    from sapwood.scheduler.runtime.store_writer import RayStoreTransport
    from sapwood.scheduler.signals import CellState, Signals
    from tests.support.elastic_runtime import initial_state, model_config

    rt = ElasticRuntime(f"sqlite:///{tmp_path / 'store.db'}", [CellSpec("c0"), CellSpec("c1")], model_config(),
                        initial_state(), actor_prefix=f"t{time.time_ns()}")
    try:
        prefix = rt.actor_prefix
        actuator = RayActuator.connect(prefix)
        with pytest.raises(ValueError, match="no elastic runtime"):
            RayActuator.connect(prefix + "-missing")
        cells = tuple(CellState(cell_id=c, role="rollout", capacity=2) for c in ("c0", "c1"))
        loop = SchedulerLoop(lambda: Signals(at_s=time.time(), cells=cells, batch_size=4), _ParkFirstCell(),
                             RayStoreTransport(rt.writer), actuator)
        result = loop.tick()
        assert result.moves == {"c0": ("rollout", "idle")}
        assert ray.get(rt.cells["c0"].status.remote())["role"] == "idle"
        assert ray.get(rt.router.stats.remote())["roles"]["c0"] == "idle"
        assert {"drain", "grace"} <= rt.switch_phases("c0")
        assert [d["reason"] for d in rt.decisions("c0", "idle")] == ["test: park c0"]
        assert rt.cell_roles()["c0"] == "idle"
    finally:
        rt.shutdown()


def test_store_writer_records_an_execution_lost_before_it_started(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import uuid

    from sapwood.scheduler.runtime.cluster import StoreWriterActor

    writer = StoreWriterActor.remote(f"sqlite:///{tmp_path / 'store.db'}")
    try:
        eid = str(uuid.uuid4())
        with pytest.raises(ray.exceptions.RayTaskError, match="pass run_id and task_id"):
            ray.get(writer.finish_lost.remote(eid, "gone"))
        assert ray.get(writer.finish_lost.remote(eid, "actor lost before its first event", run_id="r", task_id="t"))
        assert not ray.get(writer.finish_lost.remote(eid, "again", run_id="r", task_id="t"))  # finished already
        rows = list(ray.get(writer.executions.remote()).values())
        assert len(rows) == 1
        assert rows[0].status == "error"
        assert rows[0].message == "actor lost before its first event"
        assert rows[0].metadata.get("lost_before_start") is True
    finally:
        ray.kill(writer)


def test_routed_engine_refuses_an_answer_for_other_input_ids() -> None:
    import numpy as np

    from sapwood.demo.elastic.executions import RoutedEngine
    from sapwood.rollout.engines import EngineError, SamplingParams
    from sapwood.scheduler.runtime.cell import input_digest

    assert input_digest([1, 2, 3]) == input_digest([1, 2, 3]) != input_digest([1, 2, 4])

    @ray.remote(num_cpus=0)
    class AnswersForOtherIds:
        def generate(self, input_ids, params):  # type: ignore[no-untyped-def]
            return {"status": "ok", "output_ids": np.array([5], dtype=np.int32),
                    "logprobs": np.array([-0.1], dtype=np.float32), "policy_version": 0, "finish_reason": "length",
                    "cell_id": "c9", "input_digest": input_digest([*input_ids, 0]), "timings": {}, "attempts": []}

    router = AnswersForOtherIds.remote()  # type: ignore[attr-defined]
    try:
        with pytest.raises(EngineError, match="other input ids"):
            RoutedEngine(router).generate([1, 2, 3], SamplingParams(max_new_tokens=1))
    finally:
        ray.kill(router)
