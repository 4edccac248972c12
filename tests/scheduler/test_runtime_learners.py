"""Core and satellite learners in separate processes over gloo: hot-plug mid-batch and stale refusal."""

from __future__ import annotations

import pytest
import torch

from sapwood.scheduler.runtime.learners import (
    GroupConfig,
    SatellitePlan,
    gradient,
    reference_steps,
    run_group,
    small_model,
)

CFG = GroupConfig(steps=3, micro_batches=8, rows=16, compute_delay_s=0.05)


@pytest.fixture(scope="module")
def group():  # type: ignore[no-untyped-def]
    """Satellite 1 joins step 0 after two micro-batches and leaves step 1 after one contribution;
    satellite 2 pulls at step 1 and contributes to step 2 with that (stale) snapshot."""
    plans = [SatellitePlan(join_step=0, join_after=2, leave_step=1, leave_after=1),
             SatellitePlan(join_step=1, stale=True)]
    return run_group(CFG, plans)


def test_satellite_joining_mid_batch_gives_the_fixed_set_step(group) -> None:  # type: ignore[no-untyped-def]
    core, _ = group
    ref = reference_steps(CFG)
    assert core.accepted[0].get(1, 0) >= 1  # the satellite's gradients went into step 0
    assert 2 <= core.first_satellite_after[0] < CFG.micro_batches  # ... after the batch had started
    assert torch.allclose(core.params[0], ref[0], rtol=1e-10, atol=1e-12)


def test_satellite_leaving_mid_batch_gives_the_fixed_set_step(group) -> None:  # type: ignore[no-untyped-def]
    core, sent = group
    ref = reference_steps(CFG)
    assert core.accepted[1].get(1, 0) >= 1
    assert [r for r in core.released if r[:2] == (1, 1)]
    assert sum(core.accepted[1].values()) == CFG.micro_batches
    assert torch.allclose(core.params[1], ref[1], rtol=1e-10, atol=1e-12)
    assert 2 not in core.accepted or 1 not in core.accepted[2]  # it had left: nothing from it in step 2
    assert sent[1] == core.accepted[0].get(1, 0) + core.accepted[1].get(1, 0)


def test_stale_snapshot_contribution_is_refused(group) -> None:  # type: ignore[no-untyped-def]
    core, sent = group
    ref = reference_steps(CFG)
    assert sent[2] == 1
    assert [(s, r, v) for s, r, v, _ in core.refused] == [(2, 2, 1)]  # step 2, rank 2, snapshot version 1
    assert core.accepted[2] == {0: CFG.micro_batches}  # the core recomputed the refused micro-batch
    assert torch.allclose(core.params[2], ref[2], rtol=1e-10, atol=1e-12)
    # Control: had the stale gradient been accepted, the step would differ.
    (_, _, _, index) = core.refused[0]
    model = small_model(CFG.seed)
    fresh = [gradient(model, ref[1], CFG, 2, i) for i in range(CFG.micro_batches)]
    stale = gradient(model, ref[0], CFG, 2, index)
    assert not torch.allclose(stale, fresh[index], rtol=1e-6, atol=1e-9)
