"""Simulator invariants: conservation, closed form, elastic vs the best static split, determinism."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sapwood.scheduler.simulator import preset, simulate
from sapwood.scheduler.simulator.sweep import best_static, compare, sweep
from sapwood.scheduler.simulator.workload import Workload

SMALL = preset("small")


@pytest.mark.parametrize("policy", ["elastic", "colocate", "async"])
def test_every_rollout_completes_and_trains_exactly_once(policy: str) -> None:
    r = simulate(SMALL.with_(tail_ratio=10.0), policy, seed=3)
    assert r.steps == SMALL.steps
    assert r.completions.shape == (SMALL.rollouts,)
    np.testing.assert_array_equal(r.completions, 1)
    np.testing.assert_array_equal(r.trained, 1)
    assert len(r.staleness) == SMALL.rollouts


@pytest.mark.parametrize(("cells", "batch"), [(8, 32), (4, 32), (8, 20)])
def test_zero_variance_colocate_equals_closed_form(cells: int, batch: int) -> None:
    w = SMALL.with_(tail_ratio=1.0, cells=cells, batch_size=batch, switch_cost_s=7.0)
    waves = math.ceil(batch / (cells * w.slots_per_cell))
    closed = w.steps * (waves * w.rollout_p50_s + w.train_cell_s_per_step / cells) + (2 * w.steps - 1) * w.switch_cost_s
    r = simulate(w, "colocate", 0)
    assert r.wall_s == pytest.approx(closed, rel=1e-12)
    assert r.staleness == [0] * w.rollouts
    assert r.switch_count == (2 * w.steps - 1) * cells


@pytest.mark.parametrize(("name", "seed", "tail"), [("small", 0, 1.0), ("small", 1, 4.0), ("small", 2, 10.0),
                                                   ("paper", 0, 4.0)])
def test_elastic_never_worse_than_best_static_by_more_than_its_switch_costs(name: str, seed: int, tail: float) -> None:
    w = preset(name).with_(tail_ratio=tail, steps=min(preset(name).steps, 4))
    elastic = simulate(w, "elastic", seed)
    _, static = best_static(w, seed)
    assert elastic.wall_s <= static.wall_s + elastic.switch_cell_s


def test_same_seed_same_result_and_other_seed_differs() -> None:
    a, b, c = (simulate(SMALL, "elastic", s) for s in (5, 5, 6))
    assert a.summary() == b.summary()
    assert a.timeline == b.timeline
    assert a.moves == b.moves
    assert a.wall_s != c.wall_s


def test_async_staleness_bound_zero_is_on_policy() -> None:
    r = simulate(SMALL, "async", 0, max_staleness=0)
    assert set(r.staleness) == {0}


def test_idle_fractions_are_fractions_and_time_adds_up() -> None:
    r = simulate(SMALL, "elastic", 0)
    for role in ("rollout", "train", "switching"):
        assert 0.0 <= r.idle_fraction[role] <= 1.0
    assert sum(r.cell_seconds.values()) == pytest.approx(r.wall_s * SMALL.cells, rel=1e-9)
    assert r.switch_cell_s == pytest.approx(r.switch_count * SMALL.switch_cost_s)


def test_compare_and_sweep_shapes() -> None:
    w = SMALL.with_(steps=3)
    cmp = compare(w)
    assert set(cmp.ratios()) == {"elastic_vs_colocate", "elastic_vs_async_half", "elastic_vs_best_static"}
    rows = sweep(w, "tail_ratio", [1.0, 5.0])
    assert [r["tail_ratio"] for r in rows] == [1.0, 5.0]


def test_workload_rejects_bad_parameters() -> None:
    with pytest.raises(ValueError, match="tail_ratio"):
        Workload(tail_ratio=0.5)
    with pytest.raises(ValueError, match="cells"):
        Workload(cells=0)
    with pytest.raises(ValueError, match="unknown workload preset"):
        preset("nope")


def test_tail_ratio_sets_p99_over_p50() -> None:
    w = Workload(steps=400, batch_size=250, tail_ratio=6.0)
    d = w.durations(0)
    assert np.percentile(d, 99) / np.median(d) == pytest.approx(6.0, rel=0.05)


def test_simulate_command_prints_json_and_writes_plots(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json

    from typer.testing import CliRunner

    from sapwood.platform.cli import app

    result = CliRunner().invoke(app, ["scheduler", "simulate", "--preset", "small", "--steps", "3",
                                      "--plots", str(tmp_path)])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert [r["policy"] for r in out["results"]] == ["elastic", "colocate", "async"]
    by = {r["policy"]: r["wall_h"] for r in out["results"]}
    assert out["elastic_vs_colocate"] == pytest.approx(by["colocate"] / by["elastic"], rel=1e-3)
    assert sorted(p.name for p in tmp_path.glob("*.png")) == [
        "idle_fractions.png", "roles_async.png", "roles_colocate.png", "roles_elastic.png"]
    bad = CliRunner().invoke(app, ["scheduler", "simulate", "--preset", "nope"])
    assert bad.exit_code != 0
    assert "unknown workload preset" in bad.output


def test_simulate_command_takes_the_workload_flags() -> None:
    import json

    from typer.testing import CliRunner

    from sapwood.platform.cli import app

    args = ["scheduler", "simulate", "--preset", "small", "--steps", "2", "--policies", "async",
            "--batch-rule", "first_finished", "--stale-rollouts", "discount", "--timeout-factor", "2.5",
            "--core-cells", "3", "--streaming", "--join-cost-s", "42"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    w = json.loads(result.stdout.strip().splitlines()[-1])["workload"]
    assert (w["batch_rule"], w["stale_rollouts"], w["timeout_factor"]) == ("first_finished", "discount", 2.5)
    assert (w["core_cells"], w["streaming_accumulation"], w["join_cost_s"]) == (3, True, 42.0)
    bad = CliRunner().invoke(app, ["scheduler", "simulate", "--preset", "small", "--batch-rule", "newest"])
    assert bad.exit_code != 0
    assert "batch_rule" in bad.output


def test_simulate_command_reports_async_at_its_best_split() -> None:
    import json

    from typer.testing import CliRunner

    from sapwood.platform.cli import app

    args = ["scheduler", "simulate", "--preset", "small", "--steps", "2", "--policies", "elastic", "--best-split"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout.strip().splitlines()[-1])
    k, static = best_static(SMALL.with_(steps=2), 0)
    assert out["best_static"]["rollout_cells"] == k
    assert out["best_static"]["wall_h"] == pytest.approx(static.wall_s / 3600, abs=1e-4)
    assert out["elastic_vs_best_static"] == pytest.approx(out["best_static"]["wall_h"] / out["results"][0]["wall_h"],
                                                          rel=1e-3)


def test_replayed_durations_are_used_in_admission_order_and_repeat_for_a_longer_draw() -> None:
    w = SMALL.with_(batch_size=2, steps=2, durations_s=(1.0, 3.0, 2.0, 5.0))
    np.testing.assert_array_equal(w.durations(0), [1.0, 3.0, 2.0, 5.0])
    np.testing.assert_array_equal(w.durations(7, 6), [1.0, 3.0, 2.0, 5.0, 1.0, 3.0])


def test_colocate_on_replayed_durations_equals_closed_form() -> None:
    """One cell, one batch per wave: each step waits for its batch's longest replayed rollout."""
    w = Workload(cells=1, slots_per_cell=2, batch_size=2, steps=2, core_cells=0, train_cell_s_per_step=4.0,
                 switch_cost_s=0.5, tick_s=0.1, timeout_factor=math.inf, durations_s=(1.0, 3.0, 2.0, 5.0))
    closed = (3.0 + 5.0) + 2 * 4.0 + (2 * 2 - 1) * 0.5
    assert simulate(w, "colocate", 0).wall_s == pytest.approx(closed, rel=1e-12)


@pytest.mark.parametrize("bad", [(), (0.0,), (1.0, math.nan), (1.0, -2.0), (math.inf,)])
def test_replayed_durations_must_be_finite_positive_seconds(bad: tuple[float, ...]) -> None:
    with pytest.raises(ValueError, match="durations_s"):
        Workload(durations_s=bad)


@pytest.mark.parametrize(("cells", "serial"), [(1, 0.75), (2, 0.75), (4, 0.75), (2, 1.0), (2, 2.5)])
def test_a_steps_serial_part_is_added_once_per_step_whatever_the_train_cells(cells: int, serial: float) -> None:
    """Colocate closed form with a serial part: each step costs cell-seconds / cells + serial seconds. A serial
    part of 10 ticks (1 s) or more, with nothing else running, is not a stall (it was reported as one)."""
    w = Workload(cells=cells, slots_per_cell=2, batch_size=2, steps=2, core_cells=0, train_cell_s_per_step=4.0,
                 switch_cost_s=0.5, tick_s=0.1, timeout_factor=math.inf, durations_s=(1.0, 3.0, 2.0, 5.0),
                 train_step_serial_s=serial)
    closed = (3.0 + 5.0) + 2 * (4.0 / cells + serial) + (2 * 2 - 1) * 0.5
    assert simulate(w, "colocate", 0).wall_s == pytest.approx(closed, rel=1e-12)


@pytest.mark.parametrize("bad", [-0.1, math.nan, math.inf])
def test_a_steps_serial_part_must_be_finite_seconds_at_least_zero(bad: float) -> None:
    with pytest.raises(ValueError, match="train_step_serial_s"):
        Workload(train_step_serial_s=bad)
