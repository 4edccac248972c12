"""Training on the cells (local Ray, gloo): the core cell owns the SAO learner, a satellite entering train
in the middle of a step claims the running step's micro-batches, a stale snapshot's gradient is refused,
and a versioned weight broadcast reaches a rollout cell. Every group step must equal the project's
single-process ``SAOTrainer`` step on the same batch (the real loss, split exactly)."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import pytest
import torch

ray = pytest.importorskip("ray")

from sapwood.learner.config import CriticConfig  # noqa: E402
from sapwood.learner.model import TinyActorCritic, TorchBackend  # noqa: E402
from sapwood.learner.trainer import SAOTrainer  # noqa: E402
from sapwood.scheduler.runtime.cell_learner import GroupSpec, micro_gradient, micro_split  # noqa: E402
from sapwood.scheduler.runtime.cluster import CellActor, init_ray  # noqa: E402
from sapwood.scheduler.runtime.device_clock import DeviceCosts  # noqa: E402
from tests.support.megatron_ranks import (  # noqa: E402
    model_config,
    near_policy_batch,
    parallel_config,
    require_megatron,
)

CONFIG = replace(parallel_config(), critic=CriticConfig(warmup_steps=0, catchup_max_steps=0))
MICRO = 4


def _state(seed: int = 0) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    return TinyActorCritic(model_config()).state_dict()


def _batch(seed: int) -> Any:
    torch.manual_seed(seed)
    return near_policy_batch(TinyActorCritic(model_config()), seed, num_executions=4)


def wait_for(cond: Callable[[], bool], what: str, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@pytest.fixture(scope="module", params=["torch", "megatron"])
def group(request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    """Three cells in one gloo group: c0 the core (idle), c1 a would-be satellite (idle), c2 serving; the
    replicas on the torch backend or on megatron-core (``GroupSpec.learner_backend``). Either way the
    reference is the one-process ``TorchBackend`` step: the megatron model computes the same function."""
    backend = request.param
    if backend == "megatron":
        require_megatron()
    init_ray(num_cpus=2)
    roles = {"c0": "idle", "c1": "idle", "c2": "rollout"}
    cells = {cid: CellActor.options(max_concurrency=8).remote(cid, model_config(), _state(), role=role)
             for cid, role in roles.items()}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ray.get([cells[c].join_group.remote(GroupSpec(port, r, 3, micro_batches=MICRO, stall_timeout_s=2.0,
                                                    learner_backend=backend))
             for r, c in enumerate(cells)])
    ray.get(cells["c0"].start_trainer.remote(CONFIG, _state(), 0))
    reference = TorchBackend(TinyActorCritic(model_config()), CONFIG.optim, critic_grad_clip=CONFIG.critic.grad_clip)
    reference.model.load_state_dict(_state())
    yield {"cells": cells, "reference": SAOTrainer(reference, CONFIG), "backend": backend}
    for c in cells.values():
        ray.kill(c)
    ray.shutdown()


def _equal_to_reference(group: dict[str, Any], batch: Any, metrics: dict[str, float]) -> None:
    """The group step's gradient norms and loss equal the one-process step's, and so do ≥ 99 % of the
    parameters (Adam's first steps are ≈ lr × sign(g): where the true gradient is 0, e.g. the key
    biases, float noise picks the sign, so those elements may differ by 2 lr)."""
    ref_metrics = group["reference"].train_step(batch)
    for k in ("actor/grad_norm", "critic/grad_norm", "train/loss", "critic/value_loss"):
        assert metrics[k] == pytest.approx(ref_metrics[k], rel=1e-4), k
    version, state = ray.get(group["cells"]["c0"].learner_state.remote())
    ref = group["reference"].backend
    assert version == ref.policy_version
    close = total = 0
    for k, v in ref.model.state_dict().items():
        close += int(torch.isclose(state[k], v, rtol=1e-4, atol=1e-6).sum())
        total += v.numel()
    assert close >= 0.99 * total, f"only {close} of {total} parameters equal the one-process step's"


def test_the_core_holds_a_replica_of_the_groups_backend(group: dict[str, Any]) -> None:
    cells = group["cells"]
    want = {"torch": "TorchBackend", "megatron": "MegatronBackend"}[group["backend"]]
    assert ray.get(cells["c0"].group_stats.remote())["replica"] == want
    assert ray.get(cells["c1"].group_stats.remote())["replica"] is None, "only the core holds the optimizer"


def test_micro_batch_gradients_sum_to_the_whole_batchs_gradient() -> None:
    """The split of the real SAO loss is exact (boundaries: more micro-batches than tokens give empty chunks)."""
    from sapwood.learner.advantages import batch_gae
    from sapwood.learner.model import tree_forward
    from sapwood.learner.trainer import LossTargets, compute_losses
    from sapwood.scheduler.runtime.cell_learner import flat_grad

    torch.manual_seed(0)
    model = TinyActorCritic(model_config())
    batch = _batch(3)
    with torch.no_grad():
        old = tree_forward(model, batch)
    targets = LossTargets.build(batch, batch_gae(batch, old.values, CONFIG.advantage), old, CONFIG.policy)
    model.zero_grad()
    compute_losses(tree_forward(model, batch), targets, CONFIG)[0].backward()
    whole = flat_grad(model)
    for m in (1, 3, int(targets.mask.sum()) + 2):
        masks, shares = micro_split(targets, m)
        assert sum(shares) == pytest.approx(1.0)
        assert int(sum(mk.sum() for mk in masks)) == int(targets.mask.sum()), "chunks partition the trainable tokens"
        total = sum(micro_gradient(model, batch, targets, CONFIG, mk, sh) for mk, sh in zip(masks, shares, strict=True))
        torch.testing.assert_close(total, whole, rtol=1e-4, atol=1e-6)


def test_a_satellite_entering_train_mid_step_contributes_to_the_running_step(group: dict[str, Any]) -> None:
    cells = group["cells"]
    ray.get([cells["c0"].set_device_costs.remote(DeviceCosts(train_microbatch_s=1.0)),
             cells["c1"].set_device_costs.remote(DeviceCosts(train_microbatch_s=0.05))])
    ray.get(cells["c0"].set_role.remote("train"))
    batch = _batch(1)
    step = cells["c0"].train_batch.remote(batch)
    wait_for(lambda: ray.get(cells["c0"].group_stats.remote())["covered"] >= 1, "the core's first micro-batch")
    ray.get(cells["c1"].set_role.remote("train"))  # freed from rollout in the middle of the step
    metrics = ray.get(step)
    assert metrics["train/policy_version"] == 1.0
    stats = ray.get(cells["c0"].group_stats.remote())
    accepted = stats["accepted"][0]
    assert accepted.get(1, 0) >= 1, f"the satellite's gradients were not used in the running step: {accepted}"
    assert sum(accepted.values()) == MICRO
    assert stats["first_satellite_after"][0] >= 1, "the satellite joined after the step had started"
    _equal_to_reference(group, batch, metrics)
    ray.get([cells["c1"].set_role.remote("idle"), cells["c0"].set_role.remote("idle")])


def test_a_stale_snapshots_gradient_is_refused(group: dict[str, Any]) -> None:
    """c1 claims a micro-batch of step v but takes 4 s of device time for it; the core (stall 2 s)
    covers the step alone and closes it; c1's gradient (snapshot v) arrives during step v + 1 and is
    refused, and step v + 1 still equals the one-process step."""
    cells = group["cells"]
    ray.get([cells["c0"].set_device_costs.remote(DeviceCosts()),
             cells["c1"].set_device_costs.remote(DeviceCosts(train_microbatch_s=4.0))])
    sent_before = ray.get(cells["c1"].group_stats.remote())["sent"]
    v = ray.get(cells["c0"].learner_state.remote())[0]  # step "first" runs at version v, "second" at v + 1
    ray.get(cells["c1"].set_role.remote("train"))
    first = _batch(2)
    _equal_to_reference(group, first, ray.get(cells["c0"].train_batch.remote(first)))
    ray.get(cells["c1"].set_role.remote("idle"))
    wait_for(lambda: ray.get(cells["c1"].group_stats.remote())["sent"] > sent_before, "the slow satellite's gradient")
    second = _batch(4)
    metrics = ray.get(cells["c0"].train_batch.remote(second))
    stats = ray.get(cells["c0"].group_stats.remote())
    stale = [r for r in stats["refused"] if r[1] == 1 and r[2] == v]
    assert stale, f"the gradient of snapshot {v} was not refused: {stats['refused']}"
    assert stale[0][0] in (v + 1, -1), "refused for being stale (the next step open, or between steps)"
    assert 1 not in stats["accepted"].get(v + 1, {}), "the stale gradient did not enter the next step"
    _equal_to_reference(group, second, metrics)


def test_a_satellite_leaving_mid_step_leaves_no_micro_batch_to_the_core(group: dict[str, Any]) -> None:
    """The core is not in train; two satellites run the step (c1 fast, c2 slow: the counter is not spent
    when c1 ends its second micro-batch) and c1 leaves after its first micro-batch.
    c1 finishes what it claimed and claims nothing after its role changed, and what is left goes to c2,
    so the step never stalls (no fallback) and the core computes none of it. (Before the redo queue, c1
    claimed its next micro-batch and released it to the core, which waited ``stall_timeout_s``.)"""
    cells = group["cells"]
    ray.get([cells["c0"].set_device_costs.remote(DeviceCosts()),
             cells["c1"].set_device_costs.remote(DeviceCosts(train_microbatch_s=0.5)),
             cells["c2"].set_device_costs.remote(DeviceCosts(train_microbatch_s=1.2))])
    ray.get([cells["c1"].set_role.remote("train"), cells["c2"].set_role.remote("train")])
    batch = _batch(5)
    v = ray.get(cells["c0"].learner_state.remote())[0]
    step = cells["c0"].train_batch.remote(batch)
    wait_for(lambda: ray.get(cells["c0"].group_stats.remote())["accepted"].get(v, {}).get(1, 0) >= 1,
             "c1's first micro-batch")
    ray.get(cells["c1"].set_role.remote("idle"))
    metrics = ray.get(step)
    stats = ray.get(cells["c0"].group_stats.remote())
    accepted = stats["accepted"][v]
    assert v not in stats["fallbacks"], f"the step stalled and the core covered it alone: {stats['fallbacks']}"
    assert accepted.get(0, 0) == 0, f"the core (not in train) computed micro-batches: {accepted}"
    assert accepted.get(1, 0) + accepted.get(2, 0) == MICRO
    _equal_to_reference(group, batch, metrics)
    ray.get(cells["c2"].set_role.remote("rollout"))


def test_a_weight_broadcast_reaches_a_rollout_cell_with_the_new_version(group: dict[str, Any]) -> None:
    cells = group["cells"]
    version, state = ray.get(cells["c0"].learner_state.remote())
    assert version >= 1
    assert ray.get(cells["c2"].status.remote())["policy_version"] == 0
    sent, got = ray.get([cells["c0"].broadcast_weights.remote([2]), cells["c2"].receive_weights.remote()])
    assert sent == got == version
    assert ray.get(cells["c2"].status.remote())["policy_version"] == version
    served_version, served = ray.get(cells["c2"].params.remote())
    assert served_version == version
    for k, v in state.items():
        assert torch.equal(served[k], v), f"{k}: the rollout cell does not serve the broadcast weights"
