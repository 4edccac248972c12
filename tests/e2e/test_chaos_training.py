"""A short training chaos campaign (bench/chaos_training.py) on PostgreSQL: 3 rollout workers and 2 learners
killed at random and at their fault points; every prompt sample rolled out once, every finished execution
trained exactly once in one published version, versions contiguous, checkpoints matching their digests."""

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
                                       out=tmp_path, max_seconds=280.0)
    assert figures["finished"], figures
    assert figures["random_kills"] >= 8, figures
    assert figures["deaths"] >= 8, figures
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
                                       out=tmp_path, max_seconds=280.0, kafka=kafka_bootstrap, ingests=2)
    assert figures["transport"] == "kafka"
    assert figures["finished"], figures
    assert figures["random_kills"] >= 8, figures
    assert figures["fault_deaths"].get("ingest.after_apply", 0) >= 1, figures
    assert figures["samples"] == 60
    assert figures["samples_skipped"] == 0
    assert figures["samples_duplicated"] == 0
    assert figures["abandoned_queued_for_training"] == 0
    assert figures["untrained"] == 0
    assert figures["trained_twice"] == 0
    assert figures["audit_ok"], figures
