"""``sapwood demo --elastic --compare`` without Ray: schedule names, the per-seed summary, the goals, the
simulator's calibration from measured costs, the occupancy accounting and the option checks."""

from __future__ import annotations

import math
from typing import Any

import pytest
from typer.testing import CliRunner

from sapwood.demo.elastic.compare import (
    calibrated_workload,
    compare_schedules,
    predict,
    step_cost_fit,
    summarise,
    summarise_seed,
    uncontended_durations,
)
from sapwood.demo.elastic.driver import (
    ElasticDemoConfig,
    ScheduleResult,
    _accumulate,
    admission_bound,
    schedule_policy,
    static_splits,
)
from sapwood.demo.elastic.executions import ExecutionOutcome
from sapwood.platform.cli import app


def test_every_static_split_is_compared() -> None:
    assert static_splits(2) == ("static-1",)
    assert static_splits(4) == ("static-1", "static-2", "static-3")
    assert compare_schedules(3) == ("elastic", "static-1", "static-2", "colocate")
    assert compare_schedules(3, reference=True) == ("elastic", "static-1", "static-2", "colocate", "colocate-sync")
    with pytest.raises(ValueError, match="≥ 2 cells"):
        static_splits(1)


def test_a_static_schedule_names_its_rollout_cells() -> None:
    assert schedule_policy("static-2", 3, 0) == ("async", {"rollout_cells": 2, "max_staleness": 0})
    assert schedule_policy("static-1", 2, 1) == ("async", {"rollout_cells": 1, "max_staleness": 1})
    for bad in ("static-0", "static-3", "static-x", "static-"):
        with pytest.raises(ValueError, match="1 ≤ R < 3"):
            schedule_policy(bad, 3, 1)
    with pytest.raises(ValueError, match="unknown schedule 'round-robin'"):
        schedule_policy("round-robin", 3, 1)
    name, args = schedule_policy("elastic", 3, 0)
    assert (name, args["staleness_bound"]) == ("elastic", 0)
    # colocate is simulated with the admission the live run gives every schedule
    assert schedule_policy("colocate", 3, 1) == ("colocate", {"max_staleness": 1})
    assert schedule_policy("colocate", 3, 0) == ("colocate", {"max_staleness": 0})


def test_the_synchronous_colocate_admits_one_batch_per_version_whatever_the_run_s_bound() -> None:
    assert schedule_policy("colocate-sync", 3, 1) == ("colocate", {"max_staleness": 0})
    assert schedule_policy("colocate-sync", 3, 0) == ("colocate", {"max_staleness": 0})
    assert [admission_bound(n, 1) for n in compare_schedules(3, reference=True)] == [1, 1, 1, 1, 0]
    assert admission_bound("elastic", 0) == 0


def test_the_demo_s_micro_batches_divide_evenly_over_every_train_cell_count() -> None:
    cfg = ElasticDemoConfig()
    assert cfg.train_step_cell_s == pytest.approx(1.5)
    assert all(cfg.micro_batches % n == 0 for n in range(1, cfg.cells + 1))


def _arm(wall: float, reward: float | None) -> dict[str, Any]:
    return {"wall_s": wall, "eval_reward_end": reward}


def test_the_best_static_split_is_the_fastest_and_ratios_are_over_elastic() -> None:
    row = summarise_seed(4, {"elastic": _arm(10.0, 0.6), "static-1": _arm(15.0, 0.6),
                             "static-2": _arm(12.0, 0.6), "colocate": _arm(13.0, 0.6)}, 0.5)
    assert row["best_static"] == "static-2"
    assert row["elastic_over_best_static"] == 1.2
    assert row["elastic_over_colocate"] == 1.3
    tie = summarise_seed(0, {"elastic": _arm(5.0, 0.6), "static-2": _arm(6.0, 0.6), "static-1": _arm(6.0, 0.6),
                             "colocate": _arm(5.0, 0.6)}, 0.5)
    assert tie["best_static"] == "static-1"  # a tie goes to the first name, whatever the order
    with pytest.raises(ValueError, match="needs elastic, colocate and a static split"):
        summarise_seed(0, {"elastic": _arm(1.0, 0.6), "colocate": _arm(1.0, 0.6)}, 0.5)


def test_the_synchronous_colocate_is_a_reference_ratio_beside_the_goals() -> None:
    arms = {"elastic": _arm(10.0, 0.6), "static-1": _arm(12.0, 0.6), "colocate": _arm(11.0, 0.6),
            "colocate-sync": _arm(14.0, 0.6)}
    row = summarise_seed(0, arms, 0.5)
    assert row["elastic_over_colocate_sync"] == 1.4
    assert row["elastic_over_colocate"] == 1.1, "the goal's colocate stays the one admitting a batch ahead"
    assert "elastic_over_colocate_sync" not in summarise_seed(0, {k: v for k, v in arms.items()
                                                                  if k != "colocate-sync"}, 0.5)
    rows = [{**_row(1.2, 1.1, 1.2, 1.1), "elastic_over_colocate_sync": r,
             "simulator": {**_row(1.2, 1.1, 1.2, 1.1)["simulator"], "elastic_over_colocate_sync": 1.5}}
            for r in (1.0, 2.0, 2.0)]
    out = summarise(rows)
    assert out["elastic_over_colocate_sync"] == round(4 ** (1 / 3), 4)
    assert out["simulator_elastic_over_colocate_sync"] == 1.5
    assert out["reference_simulator_error"] == round(1.5 / round(4 ** (1 / 3), 4) - 1, 4)
    assert "elastic_over_colocate_sync" not in out["goals"]
    assert out["goals"]["elastic_over_colocate"] is False, "1.1 < 1.3 whatever the reference says"
    assert "elastic_over_colocate_sync" not in summarise([_row(1.2, 1.1, 1.2, 1.1)] * 3), "no seed has it: absent"


def test_a_reward_that_ends_where_it_started_is_not_rising() -> None:
    row = summarise_seed(0, {"elastic": _arm(1.0, 0.51), "static-1": _arm(1.0, 0.5),
                             "colocate": _arm(1.0, None)}, 0.5)
    assert row["reward_rising"] == {"elastic": True, "static-1": False, "colocate": False}
    unmeasured = summarise_seed(0, {"elastic": _arm(1.0, 0.9), "static-1": _arm(1.0, 0.9),
                                    "colocate": _arm(1.0, 0.9)}, None)
    assert not any(unmeasured["reward_rising"].values())


def _row(best: float, colocate: float, sim_best: float, sim_colocate: float, rising: bool = True) -> dict[str, Any]:
    return {"elastic_over_best_static": best, "elastic_over_colocate": colocate,
            "simulator": {"elastic_over_best_static": sim_best, "elastic_over_colocate": sim_colocate},
            "reward_rising": {"elastic": True, "static-1": rising}}


def test_goals_on_their_boundaries() -> None:
    met = summarise([_row(1.2, 1.3, 1.2, 1.3)] * 3)
    assert met["elastic_over_best_static"] == 1.2
    assert met["goals"] == {"elastic_over_best_static": True, "elastic_over_colocate": True,
                            "reward_rising_every_arm": True, "simulator_within_15pct": True,
                            "at_least_3_seeds": True}
    short = summarise([_row(1.1999, 1.2999, 1.0, 1.0, rising=False)] * 2)
    assert not any(short["goals"].values())
    assert short["simulator_error"]["elastic_over_best_static"] == round(1.0 / 1.1999 - 1, 4)


def test_the_ratios_are_geometric_means_over_the_seeds() -> None:
    out = summarise([_row(2.0, 1.0, 1.0, 1.0), _row(0.5, 1.0, 1.0, 1.0), _row(1.0, 4.0, 1.0, 1.0)])
    assert out["elastic_over_best_static"] == 1.0  # the arithmetic mean would say 1.17
    assert out["elastic_over_colocate"] == round(4 ** (1 / 3), 4)


def _outcome(i: int, seconds: float) -> ExecutionOutcome:
    return ExecutionOutcome(f"e{i}", f"task-{i}", "succeeded", started_at=1.0, finished_at=1.0 + seconds)


def _result(name: str, durations: list[float], steps: list[tuple[float, int]],
            switches: list[dict[str, Any]] | None = None,
            slots: list[tuple[float, float]] | None = None) -> ScheduleResult:
    """A schedule's result; ``slots``: per execution ``(waited_s, held_s)`` (default: no wait, half held)."""
    slots = slots if slots is not None else [(0.0, d / 2) for d in durations]
    times = {f"e{i}": {"waited_s": w, "held_s": h} for i, (w, h) in enumerate(slots)}
    return ScheduleResult(name, 1.0, len(steps), [_outcome(i, d) for i, d in enumerate(durations)], [],
                          switches or [], {}, {}, [], {}, 0, {}, steps, times)


def test_the_simulator_is_calibrated_from_the_measured_costs() -> None:
    cfg = ElasticDemoConfig(cells=3, capacity=2, executions=48, batch_size=8, staleness_bound=0)
    results = {
        "elastic": _result("elastic", [1.0, 2.0], [(9.0, 1)], [{"to": "rollout", "wall_s": 0.2},
                                                               {"to": "rollout", "wall_s": 0.4},
                                                               {"to": "train", "wall_s": 0.1}],
                           slots=[(0.0, 0.5), (0.5, 0.5)]),
        "static-1": _result("static-1", [3.0], [(1.0, 2), (1.5, 2)], slots=[(1.0, 1.0)]),
        "static-2": _result("static-2", [4.0, 5.0], [(2.0, 1)], slots=[(0.0, 1.0), (0.0, 1.0)]),
    }
    w = calibrated_workload(cfg, results)
    # task 0 alone: 1.0, 3.0 − 1.0 waited, 4.0 → median 2.0; task 1: 2.0 − 0.5, 5.0 → 3.25; the rest: their median
    assert w.durations_s is not None
    assert w.durations_s[:2] == (2.0, 3.25)
    assert set(w.durations_s[2:]) == {2.625}
    assert len(w.durations_s) == cfg.executions
    assert w.rollout_p50_s == 2.625
    assert w.slots_per_cell == 7  # duty = 4.0 held / 13.5 alone; 2 slots ÷ 0.296 = 6.75
    # static steps only: 2 cells → median 1.25 s, 1 cell → 2.0 s; 2.0 = serial + cell_s, 1.25 = serial + cell_s / 2
    assert w.train_cell_s_per_step == pytest.approx(1.5)
    assert w.train_step_serial_s == pytest.approx(0.5)
    assert w.switch_cost_s == pytest.approx(0.3)
    assert w.join_cost_s == 0.1
    assert (w.cells, w.batch_size, w.steps, w.max_staleness, w.core_cells) == (3, 8, 6, 0, 0)
    assert w.batch_rule == "first_finished"
    assert math.isinf(w.rollout_timeout_s)
    no_switch = calibrated_workload(cfg, {k: v for k, v in results.items() if k != "elastic"})
    assert (no_switch.switch_cost_s, no_switch.join_cost_s) == (0.0, None)
    with pytest.raises(ValueError, match="no training step of a static split"):
        calibrated_workload(cfg, {"elastic": results["elastic"]})
    with pytest.raises(ValueError, match="no finished execution"):
        calibrated_workload(cfg, {"static-1": _result("static-1", [], [(1.0, 1)])})
    with pytest.raises(ValueError, match="slot time"):
        calibrated_workload(cfg, {"static-1": _result("static-1", [1.0], [(1.0, 1)], slots=[])})


def test_a_busy_execution_keeps_at_least_its_held_time_and_duty_one_keeps_the_real_slots() -> None:
    """Boundaries: waiting can not cut a rollout below the time it held a slot; duty 1 keeps the real slots."""
    durations, duty = uncontended_durations(2, {"static-1": _result("static-1", [2.0, 1.0], [(1.0, 1)],
                                                                    slots=[(1.5, 2.0), (0.0, 1.0)])})
    assert durations == [2.0, 1.0]
    assert duty == 1.0
    cfg = ElasticDemoConfig(cells=3, capacity=2, executions=2, batch_size=2)
    w = calibrated_workload(cfg, {"static-1": _result("static-1", [2.0, 1.0], [(1.0, 1)],
                                                      slots=[(1.5, 2.0), (0.0, 1.0)])})
    assert w.slots_per_cell == 2


def test_the_prediction_runs_every_schedule_through_the_simulator() -> None:
    cfg = ElasticDemoConfig(cells=3, capacity=2, executions=16, batch_size=8)
    w = calibrated_workload(cfg, {"static-1": _result("static-1", [1.0, 1.5, 6.0], [(1.0, 2)])})
    assert "elastic_over_colocate_sync" not in predict(w, 3, 1, seeds=1), "no reference arm unless asked"
    out = predict(w, 3, 1, seeds=2, reference=True)
    assert set(out["wall_s"]) == {"elastic", "static-1", "static-2", "colocate", "colocate-sync"}
    # the synchronous colocate waits out each batch's tail that the other admits past: never faster
    assert out["wall_s"]["colocate-sync"] >= out["wall_s"]["colocate"]
    assert out["elastic_over_colocate_sync"] == pytest.approx(
        out["wall_s"]["colocate-sync"] / out["wall_s"]["elastic"], abs=1e-3)
    assert out["switches"]["static-1"] == 0, "a static split never switches"
    assert out["switches"]["colocate"] > 0, "colocate flips every cell each step"
    assert all(v > 0 for v in out["wall_s"].values())
    best = out["best_static"]
    assert out["wall_s"][best] == min(out["wall_s"]["static-1"], out["wall_s"]["static-2"])
    assert out["elastic_over_best_static"] == pytest.approx(out["wall_s"][best] / out["wall_s"]["elastic"], abs=1e-3)


def test_occupancy_is_accumulated_per_role_and_clipped_to_the_capacity() -> None:
    acc = dict.fromkeys(("rollout_cell_s", "rollout_slot_s", "rollout_slot_capacity_s", "train_cell_s"), 0.0)
    roles = {"a": "rollout", "b": "train", "c": "idle"}
    _accumulate(acc, 0.0, roles, {"a": 2}, 2)
    assert set(acc.values()) == {0.0}  # an empty interval adds nothing
    _accumulate(acc, 0.5, roles, {"a": 3, "b": 1}, 2)  # a full cell reports at most its capacity
    _accumulate(acc, 0.5, roles, {}, 2)
    assert acc == {"rollout_cell_s": 1.0, "rollout_slot_s": 1.0, "rollout_slot_capacity_s": 2.0,
                   "train_cell_s": 1.0}


def test_a_schedule_s_occupancies_in_its_summary() -> None:
    res = _result("static-1", [1.0], [])
    res.occupancy = {"rollout_slot_s": 3.0, "rollout_slot_capacity_s": 4.0, "train_cell_s": 2.0,
                     "train_device_s": 0.5}
    res.switches = [{"phases": {"drain": 0.1}, "wall_s": 0.25}, {"phases": {}, "wall_s": 0.5}]
    s = res.summary()
    assert (s["slot_occupancy"], s["train_cell_occupancy"], s["switch_overhead_cell_s"]) == (0.75, 0.25, 0.75)
    assert _result("colocate", [], []).summary()["slot_occupancy"] is None  # no rollout time: no ratio


def test_compare_needs_elastic_and_a_positive_seed_count() -> None:
    alone = CliRunner().invoke(app, ["demo", "--compare", "--quiet"], env={"COLUMNS": "200"})
    assert alone.exit_code == 2
    assert "--compare compares the elastic runtime's schedules: use it with --elastic" in alone.output
    none = CliRunner().invoke(app, ["demo", "--elastic", "--compare", "--compare-seeds", "0", "--quiet"],
                              env={"COLUMNS": "200"})
    assert none.exit_code == 2
    assert "--compare-seeds must be ≥ 1 (the goals need 3), got 0" in none.output


def test_the_printed_comparison_shows_each_arm_live_beside_the_simulator() -> None:
    from rich.console import Console

    from sapwood.demo.elastic.cli import _print_compare

    names = ("elastic", "static-1", "colocate")
    occ = {"slot_occupancy": 0.5, "train_cell_occupancy": 0.25, "switches": 3, "switch_overhead_cell_s": 0.125}
    row = {"seed": 4, "best_static": "static-1", "wall_s": dict(zip(names, (10.0, 12.5, 13.0), strict=True)),
           "occupancy": dict.fromkeys(names, occ), "eval_reward_end": dict.fromkeys(names, 0.625),
           "elastic_over_best_static": 1.25, "elastic_over_colocate": 1.3,
           "simulator": {"wall_s": dict(zip(names, (8.0, 11.0, 12.0), strict=True)),
                         "switches": dict(zip(names, (17.0, 0.0, 33.0), strict=True)),
                         "elastic_over_best_static": 1.375, "elastic_over_colocate": 1.5},
           "reward_rising": dict.fromkeys(names, True)}
    console = Console(record=True, width=250)
    _print_compare(summarise([row]), console)
    text = console.export_text()
    assert "static-1 (best static)" in text
    assert "17.000" in text, "the simulated switch count of the elastic arm"
    assert "+10.0%" in text, "the simulator's error on best static / elastic: 1.375 / 1.25 − 1"
    assert "at_least_3_seeds NOT met" in text
    assert "reference" not in text, "no synchronous colocate arm: no reference row"
    names_sync = (*names, "colocate-sync")
    sync = {**row, "wall_s": {**row["wall_s"], "colocate-sync": 15.0}, "elastic_over_colocate_sync": 1.5,
            "occupancy": dict.fromkeys(names_sync, occ), "eval_reward_end": dict.fromkeys(names_sync, 0.625),
            "simulator": {**row["simulator"], "wall_s": {**row["simulator"]["wall_s"], "colocate-sync": 13.5},
                          "switches": {**row["simulator"]["switches"], "colocate-sync": 12.0},
                          "elastic_over_colocate_sync": 1.6875}}
    console = Console(record=True, width=250)
    _print_compare(summarise([sync]), console)
    text = console.export_text()
    assert "colocate-sync / elastic (reference)" in text
    assert "+12.5%" in text, "the reference's simulator error: 1.6875 / 1.5 − 1"


def test_a_step_fit_that_is_not_a_serial_part_plus_a_shrinking_part_keeps_the_linear_model() -> None:
    assert step_cost_fit([(2.0, 1), (1.5, 2), (1.0, 2)]) == pytest.approx((1.5, 0.5))  # median 1.25 at 2 cells
    assert step_cost_fit([(2.0, 2), (3.0, 2)]) == (5.0, 0.0), "one train-cell count: wall × cells, no serial part"
    assert step_cost_fit([(2.0, 1), (0.5, 2)]) == (1.5, 0.0), "a negative serial part (superlinear) is not fitted"
    assert step_cost_fit([(1.0, 1), (2.0, 2)]) == (2.5, 0.0), "more cells slower: no shrinking part to fit"
    assert step_cost_fit([(1.0, 1), (1.0, 2)]) == (1.5, 0.0), "cells that do not help: cell_s = 0 is refused"
    with pytest.raises(ValueError, match="no training step"):
        step_cost_fit([])


def test_the_reference_arm_is_opt_in_and_only_for_the_comparison(monkeypatch: pytest.MonkeyPatch) -> None:
    from sapwood.demo.elastic import compare

    seen: list[bool] = []

    def record(cfg: ElasticDemoConfig, seeds: list[int], **kw: Any) -> dict[str, Any]:
        seen.append(kw["reference"])
        raise SystemExit(0)  # the run itself is the e2e test's

    monkeypatch.setattr(compare, "run_compare", record)
    for args in ([], ["--compare-reference"]):
        result = CliRunner().invoke(app, ["demo", "--elastic", "--compare", *args, "--quiet"])
        assert result.exit_code == 0, result.output
    assert seen == [False, True]
    for args in (["--compare-reference"], ["--elastic", "--compare-reference"]):
        refused = CliRunner().invoke(app, ["demo", *args, "--quiet"], env={"COLUMNS": "200"})
        assert refused.exit_code == 2
        assert "--compare-reference adds an arm to the elastic comparison: use it with --elastic --compare" in (
            refused.output)
