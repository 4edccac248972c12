"""A switch's weight load really changes what a cell serves: the newest published policy entering rollout, the
core cell's parameters entering train (local Ray; fails if either load is skipped or does nothing); and the last
rollout cell leaving while a call is in flight (the call waits in the router's queue for the next rollout cell)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch

ray = pytest.importorskip("ray")

from sapwood.scheduler.runtime.cluster import CellActor, RouterActor  # noqa: E402
from sapwood.scheduler.runtime.switch import SwitchCoordinator  # noqa: E402
from tests.support.elastic_runtime import initial_state, local_ray, model_config  # noqa: E402, F401


def _cells(roles: dict[str, str], seeds: dict[str, int]) -> tuple[dict[str, Any], Any]:
    cells = {cid: CellActor.options(max_concurrency=4).remote(cid, model_config(), initial_state(seeds[cid]),
                                                              role=role)
             for cid, role in roles.items()}
    router: Any = RouterActor.remote()
    ray.get([router.add_cell.remote(cid, cell, 1, roles[cid]) for cid, cell in cells.items()])
    return cells, router


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)


def test_entering_rollout_serves_the_newest_published_policy(tmp_path: Path) -> None:
    published = initial_state(seed=1)
    ckpt = tmp_path / "policy-v7.pt"
    torch.save({"model": published}, ckpt)
    cells, router = _cells({"c0": "idle"}, {"c0": 0})
    try:
        assert not _same(ray.get(cells["c0"].params.remote())[1], published)
        coord = SwitchCoordinator(cells, {"c0": "idle"}, router, None, policy_source=lambda: (7, str(ckpt)))
        report = coord.switch("c0", "rollout")
        assert report.work["weight_load"] == 1
        assert report.policy_version == 7
        version, state = ray.get(cells["c0"].params.remote())
        assert version == 7
        assert _same(state, published), "the cell serves the checkpoint's weights, not only its version label"
        res = ray.get(router.generate.remote([1, 2, 3], {"max_new_tokens": 2}))
        assert res["status"] == "ok"
        assert res["policy_version"] == 7
    finally:
        for actor in [*cells.values(), router]:
            ray.kill(actor)


def test_entering_train_takes_the_core_cells_parameters() -> None:
    cells, router = _cells({"c0": "rollout", "core": "train"}, {"c0": 0, "core": 3})
    try:
        core_version, core_state = ray.get(cells["core"].params.remote())
        assert not _same(ray.get(cells["c0"].params.remote())[1], core_state)
        coord = SwitchCoordinator(cells, {"c0": "rollout", "core": "train"}, router, None,
                                  tiers={"c0": "satellite", "core": "core"})
        report = coord.switch("c0", "train")
        assert report.work["weight_load"] == 1
        version, state = ray.get(cells["c0"].params.remote())
        assert version == core_version
        assert _same(state, core_state)
    finally:
        for actor in [*cells.values(), router]:
            ray.kill(actor)


def test_no_published_policy_means_no_weight_load_sample() -> None:
    cells, router = _cells({"c0": "idle"}, {"c0": 0})
    try:
        report = SwitchCoordinator(cells, {"c0": "idle"}, router, None, policy_source=lambda: None).switch(
            "c0", "rollout")
        assert "weight_load" not in report.phases
        assert "weight_load" not in report.work
        assert set(report.phases) == {"activate"}
        assert report.total_s <= report.wall_s
    finally:
        for actor in [*cells.values(), router]:
            ray.kill(actor)


def test_the_last_rollout_cell_leaves_and_its_aborted_call_waits_for_the_next_one() -> None:
    from sapwood.rollout.engines import SamplingParams

    cells, router = _cells({"c0": "rollout", "c1": "idle"}, {"c0": 0, "c1": 0})
    try:
        coord = SwitchCoordinator(cells, {"c0": "rollout", "c1": "idle"}, router, None, grace_s=0.0)
        ray.get(cells["c0"].pause.remote(after_tokens=2))
        ref = router.generate.remote([1, 2, 3], {**SamplingParams(max_new_tokens=6, stop_token_ids=()).to_dict(),
                                                 "session": "e"})
        assert ray.get(cells["c0"].wait_held.remote(1, 120.0))
        report = coord.switch("c0", "train")  # no other rollout cell: the call has no target
        assert report.aborted_calls == 1
        assert report.work["queued"] == 1
        assert "kv_handoff" not in report.phases
        deadline = time.monotonic() + 300.0  # the router takes the aborted answer and queues the call again
        while ray.get(router.queue.remote())["waiting"] != 1:
            assert time.monotonic() < deadline, "the call waits in the router's queue (demand)"
            time.sleep(0.01)
        coord.switch("c1", "rollout")
        res = ray.get(ref)
        assert res["status"] == "ok"
        assert res["cell_id"] == "c1"
        assert res["continued_tokens"] == 2
        assert len(res["output_ids"]) == 6
    finally:
        for actor in [*cells.values(), router]:
            ray.kill(actor)
