"""A short training chaos campaign (bench/chaos_training.py) on PostgreSQL: 3 rollout workers, 2 learners and
the live scheduler killed at random and at their fault points; every prompt sample rolled out once, every
finished execution trained exactly once in one published version, versions contiguous, checkpoints matching
their digests; and the no-fault comparison with its PNG."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

CAMPAIGN = Path(__file__).resolve().parents[2] / "bench" / "chaos_training.py"

pytestmark = pytest.mark.postgres


def _campaign() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sapwood_bench_chaos_training", CAMPAIGN)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_short_training_campaign_skips_duplicates_and_leaves_untrained_nothing(pg_url: str, tmp_path: Path) -> None:
    figures = _campaign().run_campaign(pg_url, prompts=40, samples=2, workers=3, learners=2, kills=8, seed=1,
                                       out=tmp_path, max_seconds=600.0)  # with 2 runtime.mid_switch rounds
    assert figures["finished"], figures
    assert figures["fault_deaths"]["runtime.mid_switch"] == 2, figures
    assert [r["restart_role"] for r in figures["mid_switch"]] == ["train", "rollout"], figures
    for r in figures["mid_switch"]:  # calls held by the crash, then served again and stored once
        assert r["held_calls"] >= 1, r
        assert r["stored_rerouted_calls"] >= r["held_calls"], r
    assert figures["random_kills"] >= 8, figures
    assert figures["deaths"] >= 8, figures
    assert figures["random_kills_by_kind"].keys() == {"worker", "learner", "scheduler"}, figures  # each kind died
    assert figures["recovery"]["scheduler"]["deaths"] >= 1, figures  # and the scheduler ticked again after it
    parts = figures["scheduler_recovery_parts"]  # its recovery split by its successor's log
    assert parts["first_tick"]["n"] >= 1, parts
    assert parts["startup"]["median_s"] > 0, parts
    assert figures["samples"] == 80
    assert figures["samples_skipped"] == 0
    assert figures["samples_duplicated"] == 0
    assert figures["abandoned_queued_for_training"] == 0
    assert figures["untrained"] == 0
    assert figures["trained_twice"] == 0
    assert figures["version_gaps"] == 0
    assert figures["bad_checkpoints"] == 0, figures
    assert figures["step_mismatches"] == 0, figures
    assert figures["audit_ok"], figures
    assert figures["versions"] >= 10
    bias = figures["length_bias"]  # re-issued samples' rollout lengths vs the others': no bias (1-in-1000 false alarm)
    assert bias["reissued"] >= 1, figures
    assert bias["p_value"] > 0.001, bias


@pytest.mark.kafka
def test_short_campaign_through_kafka_and_killed_ingest_loses_and_duplicates_nothing(
        pg_url: str, kafka_bootstrap: str, tmp_path: Path) -> None:
    figures = _campaign().run_campaign(pg_url, prompts=30, samples=2, workers=3, learners=2, kills=8, seed=2,
                                       out=tmp_path, max_seconds=600.0, kafka=kafka_bootstrap, ingests=2,
                                       mid_switch_rounds=0)
    assert figures["transport"] == "kafka"
    assert figures["finished"], figures
    assert figures["random_kills"] >= 8, figures
    assert figures["fault_deaths"].get("ingest.after_apply", 0) >= 1, figures
    assert figures["random_kills_by_kind"].keys() == {"worker", "learner", "ingest", "scheduler"}, figures
    assert figures["samples"] == 60
    assert figures["samples_skipped"] == 0
    assert figures["samples_duplicated"] == 0
    assert figures["abandoned_queued_for_training"] == 0
    assert figures["untrained"] == 0
    assert figures["trained_twice"] == 0
    assert figures["audit_ok"], figures


def test_campaign_compares_the_evaluation_reward_with_a_no_fault_run(pg_url: str, tmp_path: Path) -> None:
    figures = _campaign().run_campaign(pg_url, prompts=10, samples=2, workers=3, learners=2, kills=4, seed=3,
                                       out=tmp_path, max_seconds=600.0, compare=True, eval_points=5,
                                       mid_switch_rounds=0)
    assert figures["finished"], figures
    assert figures["audit_ok"], figures
    clean = figures["no_fault"]
    assert clean["finished"], clean
    assert clean["audit_ok"], clean
    assert (clean["samples_skipped"], clean["samples_duplicated"], clean["untrained"], clean["trained_twice"]) == (
        0, 0, 0, 0)
    reward = figures["reward"]
    for curve in (reward["chaos_curve"], reward["no_fault_curve"]):
        assert 2 <= len(curve) <= 5
        assert all(0.0 <= r <= 1.0 and se > 0 for _, r, se in curve)
    assert reward["chaos_final"] == reward["chaos_curve"][-1][1]
    assert reward["chaos_curve"][-1][0] == figures["versions"]  # the last published version is evaluated
    assert reward["within_noise"], reward  # same seed and prompts: no difference beyond the evaluation's noise
    png = Path(reward["png"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
