"""``sapwood demo --elastic --compare`` live on a small workload: every arm on real cells (local Ray), the
store checks, the calibrated simulator beside the live walls, the role changes each schedule makes."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from sapwood.demo.elastic.compare import INTEGRITY, run_compare  # noqa: E402
from sapwood.demo.elastic.driver import ElasticDemoConfig  # noqa: E402
from sapwood.demo.pretrain import PretrainConfig  # noqa: E402
from tests.support.elastic_runtime import fresh_ray  # noqa: E402, F401

ARMS = {"elastic", "static-1", "static-2", "colocate", "colocate-sync"}


@pytest.mark.usefixtures("fresh_ray")
def test_compare_plays_every_arm_live_and_predicts_it(tmp_path: Path) -> None:
    cfg = ElasticDemoConfig(executions=16, eval_executions=8, out_dir=tmp_path, critic_replay_executions=16,
                            pretrain=replace(PretrainConfig(), max_clean_steps=3, min_clean_steps=3))
    summary = run_compare(cfg, [0], reference=True)
    (row,) = summary["seeds"]
    assert set(row["wall_s"]) == ARMS
    assert set(row["simulator"]["wall_s"]) == ARMS
    assert all(w > 0 for w in (*row["wall_s"].values(), *row["simulator"]["wall_s"].values()))
    for arm, checks in row["integrity"].items():
        assert checks == dict.fromkeys(INTEGRITY, 0), arm
    # every arm admits one batch ahead of training (16 executions: all at once) but the synchronous colocate
    ahead = row["admitted_ahead_max"]
    assert ahead["colocate-sync"] == cfg.batch_size
    assert ahead["colocate"] == 2 * cfg.batch_size
    assert row["elastic_over_colocate_sync"] == pytest.approx(
        row["wall_s"]["colocate-sync"] / row["wall_s"]["elastic"], rel=1e-3)
    assert row["simulator"]["elastic_over_colocate_sync"] > 0
    assert row["occupancy"]["static-1"]["switches"] == 0
    assert row["occupancy"]["static-2"]["switches"] == 0
    # every cell into train at least once (both steps may run in one stint when every execution finished first)
    assert row["occupancy"]["colocate"]["switches"] >= cfg.cells
    assert row["simulator"]["switches"]["static-1"] == 0
    assert row["simulator"]["switches"]["colocate"] >= cfg.cells
    cal = row["calibration"]
    assert cal["slots_per_cell"] >= cfg.capacity
    assert cal["train_cell_s_per_step"] > 0
    assert cal["train_step_serial_s"] >= 0
    assert row["best_static"] in ("static-1", "static-2")
    assert row["elastic_over_best_static"] == pytest.approx(
        row["wall_s"][row["best_static"]] / row["wall_s"]["elastic"], rel=1e-3)
    assert summary["goals"]["at_least_3_seeds"] is False  # one seed here
    assert Path(summary["plots"][0]).is_file()
