"""The coordinate-search fit recovers known knobs from the per-step times they produce."""

from __future__ import annotations

import pytest

from sapwood.scheduler.simulator import preset
from sapwood.scheduler.simulator.fit import fit, fit_error, per_step_h

TRUE = preset("small").with_(steps=3, rollout_p50_s=600.0, tail_ratio=4.0)


def test_fit_recovers_the_per_step_times_of_a_known_workload() -> None:
    targets = per_step_h(TRUE, ["async", "colocate", "elastic"])
    start = TRUE.with_(rollout_p50_s=1200.0)
    assert fit_error(per_step_h(start, list(targets)), targets) > 0.2
    res = fit(start, targets, knobs=["rollout_p50_s"], rounds=1, factors=(0.5, 1.0, 2.0))
    assert res.error == pytest.approx(0.0, abs=1e-9)
    assert res.workload.rollout_p50_s == pytest.approx(600.0)


def test_fit_rejects_an_unknown_knob() -> None:
    with pytest.raises(ValueError, match="unknown knobs"):
        fit(TRUE, {"async": 1.0}, knobs=["cells"])


def test_paper_fit_is_a_preset() -> None:
    assert preset("paper-fit").steps == 48
