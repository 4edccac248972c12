"""A role switch with calls in flight, cells or execution hosts killed mid-run, executions sharing a host (local
Ray, SQLite store)."""

from __future__ import annotations

import time

import pytest

ray = pytest.importorskip("ray")

from sapwood.scheduler.runtime.cluster import CellSpec  # noqa: E402
from tests.support.elastic_runtime import Background, local_ray, start_runtime  # noqa: E402, F401


def _progress(bg: Background, eid: str) -> dict[str, int] | None:
    """An execution's progress, or None once it has ended (or its host is gone)."""
    try:
        return ray.get(bg.hosts_of[eid].progress.remote(eid))
    except ray.exceptions.RayActorError:
        return None


def test_switch_with_calls_in_flight_loses_and_duplicates_none(tmp_path) -> None:  # type: ignore[no-untyped-def]
    rt = start_runtime(tmp_path, [CellSpec("c0", capacity=2), CellSpec("c1", capacity=2)], decode_delay_s=0.01)
    try:
        # c0 holds its calls after their first token, so the switch's abort always meets a live call
        ray.get(rt.cells["c0"].pause.remote())
        bg = Background(rt, n=4, concurrency=4)
        assert ray.get(rt.cells["c0"].wait_held.remote(1, 300.0)), "no call reached c0"
        before = {eid: p for eid in list(bg.hosts_of) if (p := _progress(bg, eid)) is not None}
        report = rt.assign("c0", "train", reason="test")
        ray.get(rt.cells["c0"].resume.remote())
        assert report.aborted_calls >= 1, report
        assert report.work["abort"] == report.work["reroute"] == report.aborted_calls
        assert report.work["kv_handoff"] == report.aborted_calls, "each aborted call had c1 as its target"
        assert {"drain", "grace", "abort", "kv_handoff", "reroute", "activate"} <= set(report.phases)
        assert "weight_load" not in report.phases, "no core cell trains: nothing to load, so no phase sample"
        assert report.total_s <= report.wall_s
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
    rt = start_runtime(tmp_path, [CellSpec("c0", capacity=2), CellSpec("c1", capacity=2)], decode_delay_s=0.01)
    try:
        ray.get(rt.cells["c0"].pause.remote())  # c0 holds its calls: the kill always meets a call in flight
        bg = Background(rt, n=3, concurrency=3)
        assert ray.get(rt.cells["c0"].wait_held.remote(1, 300.0)), "no call reached c0"
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


def test_killed_execution_host_ends_its_executions_as_error_with_reason(tmp_path) -> None:  # type: ignore[no-untyped-def]
    rt = start_runtime(tmp_path, [CellSpec("c0", capacity=2)], decode_delay_s=0.01)
    try:
        ray.get(rt.cells["c0"].pause.remote())  # both executions' first calls are held on c0
        bg = Background(rt, n=2, concurrency=2, hosts=2)
        assert ray.get(rt.cells["c0"].wait_held.remote(2, 300.0)), "both executions calling"
        victim, other = sorted(bg.hosts_of)
        assert bg.hosts_of[victim] != bg.hosts_of[other], "one execution per host"
        ray.kill(bg.hosts_of[victim])
        ray.get(rt.cells["c0"].resume.remote())
        outcomes = {o.execution_id: o for o in bg.join()}
        assert outcomes[victim].status == "error"
        assert "execution host lost" in outcomes[victim].message
        assert outcomes[other].status in ("success", "timeout")
        rows = rt.executions()
        assert rows[victim].status == "error"
        assert "execution host lost" in rows[victim].message
        assert rows[other].status in ("success", "timeout")
    finally:
        rt.shutdown()


def test_many_executions_share_one_host_process_that_never_imports_torch(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from sapwood.demo.elastic.executions import ExecutionPool
    from tests.support.elastic_runtime import TASK, tasks

    rt = start_runtime(tmp_path, [CellSpec("c0", capacity=4)], decode_delay_s=0.01)
    pool = ExecutionPool(TASK, rt.router, rt.writer, run_id="run", seed=0, hosts=1, event_batch=16)
    try:
        [up] = pool.ready()
        assert up["torch_imported"] is False
        ray.get(rt.cells["c0"].pause.remote())  # 4 executions' calls held at once: all 4 play concurrently
        for t in tasks(6):
            pool.start(t)
        assert ray.get(rt.cells["c0"].wait_held.remote(4, 300.0))
        ray.get(rt.cells["c0"].resume.remote())
        outcomes = []
        while pool.running:
            outcomes += pool.poll()
        info = ray.get(pool.hosts[0].info.remote())
        assert info["pid"] == up["pid"], "the same process played them all"
        assert info["played"] == 6
        assert info["most_at_once"] >= 4
        assert info["torch_imported"] is False, "no torch in a host, after six executions"
        assert {o.host_id for o in outcomes} == {"h0"}
        assert [o.status in ("success", "timeout") for o in outcomes] == [True] * 6
        in_store = rt.call_counts()
        for o in outcomes:
            assert in_store[o.execution_id].calls == o.calls
            assert 1 <= o.event_rpcs < in_store[o.execution_id].calls + 2, "events went in batches, not one RPC each"
    finally:
        pool.close()
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
        assert actuator.queue() == {"waiting": 0, "occupied": {"c1": 0}}, "the live signals' queue: c1 alone serves"
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
