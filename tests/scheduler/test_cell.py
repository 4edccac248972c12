"""The cell's logic as a plain object (no Ray): serving, refusing, draining, aborting, loading weights."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from sapwood.rollout.engines import SamplingParams
from sapwood.scheduler.runtime.call_digest import input_digest
from sapwood.scheduler.runtime.cell import Cell, params_from_dict
from tests.support.elastic_runtime import initial_state, model_config

PARAMS = SamplingParams(max_new_tokens=6).to_dict()
IDS = [1, 2, 3, 4]


def make_cell(**kw: Any) -> Cell:
    kw.setdefault("role", "rollout")
    kw.setdefault("capacity", 1)
    return Cell("c0", model_config(), initial_state(), **kw)


def wait_for(cond: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


class InThread:
    """A call served on a thread (as Ray serves concurrent calls on a threaded actor)."""

    def __init__(self, cell: Cell, key: str, params: dict[str, Any] = PARAMS) -> None:
        self.result: dict[str, Any] = {}
        self.thread = threading.Thread(target=lambda: self.result.update(cell.generate(key, IDS, params)))
        self.thread.start()

    def join(self) -> dict[str, Any]:
        self.thread.join(60)
        assert not self.thread.is_alive(), "the call did not answer"
        return self.result


def test_a_rollout_cell_serves_a_call_and_echoes_the_input_digest() -> None:
    cell = make_cell()
    res = cell.generate("k", IDS, PARAMS)
    assert res["status"] == "ok"
    assert 1 <= len(res["output_ids"]) <= 6
    assert len(res["logprobs"]) == len(res["output_ids"])
    assert (res["logprobs"] <= 0).all()
    assert res["input_digest"] == input_digest(IDS)
    assert res["policy_version"] == 0
    assert cell.status()["served"] == 1
    assert cell.status()["in_flight"] == 0


def test_a_cell_that_is_not_in_rollout_refuses_calls() -> None:
    cell = make_cell(role="train")
    res = cell.generate("k", IDS, PARAMS)
    assert res["status"] == "refused"
    assert "is train and draining" in res["reason"]


def test_a_full_cell_refuses_and_a_drained_one_admits_nothing_new() -> None:
    cell = make_cell(decode_delay_s=0.05)
    first = InThread(cell, "a", SamplingParams(max_new_tokens=4).to_dict())
    wait_for(lambda: cell.status()["in_flight"] == 1, "the first call in flight")
    assert cell.generate("b", IDS, PARAMS)["status"] == "refused"
    assert cell.drain() == 1
    assert first.join()["status"] == "ok", "a drained cell finishes the calls it admitted"
    assert cell.wait_idle(0.0)
    refused = cell.generate("c", IDS, PARAMS)
    assert refused["status"] == "refused"
    assert "draining" in refused["reason"]


def test_abort_keeps_the_partial_output_and_answers_after_release() -> None:
    cell = make_cell(decode_delay_s=0.2, release_wait_s=600.0)
    call = InThread(cell, "k", SamplingParams(max_new_tokens=50).to_dict())
    wait_for(lambda: cell.status()["in_flight"] == 1, "the call in flight")
    cell.drain()
    assert not cell.wait_idle(0.01), "the call is still running after a short grace"
    [(key, session, ids)] = cell.abort_inflight()
    assert (key, session) == ("k", "k"), "without a session the call key names the KV"
    call.thread.join(0.3)
    assert call.thread.is_alive(), "an aborted call waits for release_aborted (the KV handoff runs first)"
    cell.release_aborted()
    res = call.join()
    assert res["status"] == "aborted"
    assert "partial output kept" in res["reason"]
    partial = res["output_ids"].tolist()
    assert 1 <= len(partial) < 50
    assert ids == IDS + partial, "abort_inflight names the ids the continuation is fed"
    assert len(res["logprobs"]) == len(partial)
    assert cell.kv_info("k") == {"tokens": len(IDS) + len(partial) - 1, "bytes": cell.kv.peek("k").nbytes,  # type: ignore[union-attr]
                                 "version": 0}
    assert cell.status()["aborted"] == 1
    assert cell.status()["unreleased_aborts"] == 0, "released, not timed out"
    assert cell.status()["served"] == 0


def test_an_aborted_call_nobody_releases_answers_after_the_release_wait() -> None:
    """A switch driver that died between its abort and its release: the call answers ``aborted`` by itself
    (the router then continues it elsewhere) and is counted as unreleased."""
    cell = make_cell(decode_delay_s=0.2, release_wait_s=0.3)
    call = InThread(cell, "k", SamplingParams(max_new_tokens=50).to_dict())
    wait_for(lambda: cell.status()["in_flight"] == 1, "the call in flight")
    cell.drain()
    [(_, _, ids)] = cell.abort_inflight()
    res = call.join()
    assert res["status"] == "aborted"
    assert ids == IDS + res["output_ids"].tolist(), "the answer carries the partial output the abort named"
    status = cell.status()
    assert status["unreleased_aborts"] == 1
    assert status["aborted"] == 1
    assert status["in_flight"] == 0, "the unreleased call left the cell"


@pytest.mark.parametrize("wait_s", [0.0, -1.0, float("nan")])
def test_the_release_wait_must_be_positive(wait_s: float) -> None:
    with pytest.raises(ValueError, match="release_wait_s must be > 0 seconds"):
        make_cell(release_wait_s=wait_s)


def test_prefill_is_used_by_the_continuing_call_and_loads_clear_it() -> None:
    cell = make_cell()
    assert cell.prefill("s", IDS) >= 0
    params = {**PARAMS, "session": "s"}
    res = cell.generate("k", IDS, params)
    assert res["status"] == "ok"
    assert cell.status()["prefix_hits"] == 1
    assert cell.status()["fed_tokens"] == len(res["output_ids"]) - 1, "the prefilled input is not fed again"
    cell.prefill("s", IDS)
    cell.load_state(initial_state(seed=1), version=3)
    res = cell.generate("k2", IDS, params)
    assert res["policy_version"] == 3
    assert cell.status()["prefix_hits"] == 1, "a KV computed on old weights is not reused"
    version, state = cell.params()
    assert version == 3
    assert set(state) == set(initial_state())


def test_an_executions_next_call_reuses_its_kv_and_samples_what_a_fresh_prefill_would() -> None:
    sticky, fresh = make_cell(seed=5), make_cell(seed=5)
    first = sticky.generate("c1", IDS, {**PARAMS, "session": "e"})
    assert fresh.generate("c1", IDS, {**PARAMS, "session": "x1"})["output_ids"].tolist() == first["output_ids"].tolist()
    nxt = IDS + first["output_ids"].tolist() + [5, 6]  # the agent loop appends the observation
    fed_before = sticky.status()["fed_tokens"]
    a = sticky.generate("c2", nxt, {**PARAMS, "session": "e"})
    b = fresh.generate("c2", nxt, {**PARAMS, "session": "x2"})
    cached = len(IDS) + len(first["output_ids"]) - 1
    assert sticky.status()["prefix_hits"] == 1
    assert sticky.status()["reused_tokens"] == cached
    assert sticky.status()["fed_tokens"] - fed_before == len(nxt) - cached + len(a["output_ids"]) - 1
    assert fresh.status()["prefix_hits"] == 0
    assert a["output_ids"].tolist() == b["output_ids"].tolist()
    np.testing.assert_allclose(a["logprobs"], b["logprobs"], atol=1e-5)
    # what the router learns its prefill rate from: a whole-context recomputation says it cached nothing
    assert (first["timings"]["cached_tokens"], first["timings"]["prefill_tokens"]) == (0, len(IDS))
    assert (a["timings"]["cached_tokens"], a["timings"]["prefill_tokens"]) == (cached, len(nxt) - cached)
    assert (b["timings"]["cached_tokens"], b["timings"]["prefill_tokens"]) == (0, len(nxt))


def test_an_input_that_does_not_extend_the_cached_tokens_recomputes() -> None:
    cell = make_cell()
    cell.generate("c1", IDS, {**PARAMS, "session": "e"})
    cell.generate("c2", [9, 9, 9, 9, 9, 9], {**PARAMS, "session": "e"})
    assert cell.status()["prefix_hits"] == 0


def test_the_kv_cache_evicts_the_least_recently_used_session_by_bytes() -> None:
    probe = make_cell()
    probe.generate("p", IDS, {**PARAMS, "stop_token_ids": (), "session": "p"})
    one = probe.kv.peek("p").nbytes  # type: ignore[union-attr]
    cell = make_cell(kv_cache_bytes=2 * one)
    for s in ("a", "b", "c"):
        cell.generate(s, IDS, {**PARAMS, "stop_token_ids": (), "session": s})
    st = cell.status()
    assert st["kv_sessions"] == 2
    assert st["kv_bytes"] == 2 * one
    assert st["kv_evictions"] == 1
    assert cell.kv_info("a") is None, "the least recently used session went first"
    assert cell.kv_info("c") is not None
    with pytest.raises(ValueError, match="KV cache budget must be ≥ 0 bytes"):
        make_cell(kv_cache_bytes=-1)


def test_roles_and_capacity_are_checked() -> None:
    cell = make_cell()
    with pytest.raises(ValueError, match="role must be one of"):
        cell.set_role("training")
    cell.set_role("idle")
    assert cell.status()["role"] == "idle"
    assert cell.status()["draining"]
    with pytest.raises(ValueError, match="capacity must be ≥ 1"):
        make_cell(capacity=0)


def test_params_travel_as_dicts() -> None:
    sp = SamplingParams(temperature=0.5, max_new_tokens=3, stop_token_ids=(7,))
    assert params_from_dict(sp.to_dict()) == sp


def test_a_paused_cell_holds_its_calls_in_flight_until_resume_or_abort() -> None:
    cell = make_cell(capacity=2)
    cell.pause(after_tokens=2)
    held = InThread(cell, "a", SamplingParams(max_new_tokens=20, stop_token_ids=()).to_dict())
    assert cell.wait_held(1, 60.0)
    assert cell.status()["in_flight"] == 1
    assert cell.status()["held"] == 1
    cell.resume()
    res = held.join()
    assert res["status"] == "ok"
    assert len(res["output_ids"]) == 20
    cell.pause(after_tokens=3)
    call = InThread(cell, "b", SamplingParams(max_new_tokens=20, stop_token_ids=()).to_dict())
    assert cell.wait_held(1, 60.0)
    cell.drain()
    [(_, _, ids)] = cell.abort_inflight()
    cell.release_aborted()
    res = call.join()
    assert res["status"] == "aborted", "an abort ends the hold"
    assert ids == IDS + res["output_ids"].tolist()
    assert len(res["output_ids"]) == 3
    with pytest.raises(ValueError, match="after_tokens must be ≥ 1"):
        cell.pause(after_tokens=0)


class _GateLock:
    """Stands in for the cell's model lock: a step waits at the gate until the test opens it, after the call
    has passed its abort check (so the test can set the abort inside the step, as a switch's abort may)."""

    def __init__(self) -> None:
        self.inner = threading.Lock()
        self.reached = threading.Event()
        self.opened = threading.Event()

    def __enter__(self) -> None:
        self.reached.set()
        assert self.opened.wait(60), "the test never opened the gate"
        self.inner.acquire()

    def __exit__(self, *exc: object) -> None:
        self.inner.release()


def test_a_call_that_stops_in_the_step_its_abort_came_is_not_named_for_a_reroute() -> None:
    """The abort lands while a step samples a stop token: the call answers ``ok`` at once. Naming it among the
    aborted calls left the switch waiting for a reroute that never comes (30 s, then the switch failed) and a
    slot reserved for it at the target for ever."""
    cell = make_cell()
    gate = _GateLock()
    cell._model_lock = gate  # type: ignore[assignment]
    every_token = tuple(range(model_config().vocab_size))
    call = InThread(cell, "k", SamplingParams(max_new_tokens=6, stop_token_ids=every_token).to_dict())
    assert gate.reached.wait(60), "the call never reached its first step"
    aborted: list[Any] = []
    aborting = threading.Thread(target=lambda: aborted.extend(cell.abort_inflight()))
    aborting.start()
    wait_for(lambda: cell._calls["k"].abort.is_set(), "the abort to reach the call")
    gate.opened.set()
    res = call.join()
    aborting.join(60)
    assert not aborting.is_alive(), "abort_inflight did not return"
    assert res["status"] == "ok", "the stop token was sampled before the abort was looked at"
    assert len(res["output_ids"]) == 1
    assert aborted == [], "a call that answered ok is not named for a reroute"
    assert cell.status()["aborted"] == 0
