"""A switch migrates a live execution's KV through Ray's object store and the call continues on the target
from its partial output: one call whose log-probs are the model's over input + all output tokens."""

from __future__ import annotations

from typing import Any

import pytest
import torch

ray = pytest.importorskip("ray")

from sapwood.learner.model import TinyActorCritic  # noqa: E402
from sapwood.rollout.engines import SamplingParams  # noqa: E402
from sapwood.scheduler.runtime.cluster import CellActor, RouterActor  # noqa: E402
from sapwood.scheduler.runtime.switch import MigrateHandoff, RecomputeHandoff, SwitchCoordinator  # noqa: E402
from tests.support.elastic_runtime import initial_state, local_ray, model_config  # noqa: E402, F401

IDS = [1, 2, 3, 4]
BUDGET = 30


def model_logprobs(ids: list[int], n_out: int) -> torch.Tensor:
    """log π(token | prefix) of the last ``n_out`` tokens of ``ids`` under the initial weights (full forward)."""
    model = TinyActorCritic(model_config()).eval()
    model.load_state_dict(initial_state())
    n = len(ids)
    with torch.no_grad():
        h = model.actor(torch.tensor(ids), torch.arange(n), torch.ones(n, n, dtype=torch.bool).tril())
        logp = torch.log_softmax(model.lm_head(h), -1)
    return torch.stack([logp[i - 1, ids[i]] for i in range(n - n_out, n)])


@pytest.mark.parametrize("handoff", ["migrate", "recompute"])
def test_a_switch_moves_the_kv_and_the_call_continues_from_its_partial_output(handoff: str) -> None:
    cells: dict[str, Any] = {
        cid: CellActor.options(max_concurrency=8).remote(cid, model_config(), initial_state(), role="idle",
                                                          decode_delay_s=0.01)
        for cid in ("c0", "c1")}
    router: Any = RouterActor.remote()
    try:
        for cid, cell in cells.items():
            ray.get(router.add_cell.remote(cid, cell, 1, "idle"))
        moves = MigrateHandoff() if handoff == "migrate" else RecomputeHandoff()
        coord = SwitchCoordinator(cells, {"c0": "idle", "c1": "idle"}, router, None, handoff=moves, grace_s=0.0)
        coord.switch("c0", "rollout")
        ray.get(cells["c0"].pause.remote(after_tokens=3))  # the call is held in flight after 3 tokens
        ref = router.generate.remote(IDS, {**SamplingParams(max_new_tokens=BUDGET).to_dict(), "session": "e"})
        assert ray.get(cells["c0"].wait_held.remote(1, 120.0)), "the call did not reach c0"
        coord.switch("c1", "rollout")
        report = coord.switch("c0", "train")
        res = ray.get(ref)
        assert report.aborted_calls == 1
        assert res["status"] == "ok"
        assert res["cell_id"] == "c1"
        k = res["continued_tokens"]
        assert k == 3, "the partial output of c0 was kept"
        out = res["output_ids"].tolist()
        assert len(out) == BUDGET
        target = ray.get(cells["c1"].status.remote())
        if isinstance(moves, MigrateHandoff):
            assert target["kv_imports"] == 1
            assert target["fed_tokens"] == BUDGET - k, "c1 fed only the last partial token and its own tokens"
            assert moves.moved[0][2], "the target kept the imported KV (same weights)"
        else:
            assert target["kv_imports"] == 0
            assert target["fed_tokens"] == BUDGET - k - 1, "c1's prefill covered input + partial output"
        assert target["prefix_hits"] == 1
        torch.testing.assert_close(torch.tensor(res["logprobs"]), model_logprobs(IDS + out, BUDGET),
                                   atol=1e-5, rtol=1e-5)
    finally:
        for actor in [*cells.values(), router]:
            ray.kill(actor)
