"""A short round of the fault campaign (bench/chaos.py) against real PostgreSQL and Kafka: SIGKILL under load,
a SIGSTOP zombie, a backend terminated mid-transaction and poison records of every kind; nothing lost or
stored twice, every dead letter with its reason, every input rebuilt exactly, projections equal to a rebuild."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

CHAOS = Path(__file__).resolve().parents[2] / "bench" / "chaos.py"


def _chaos() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sapwood_bench_chaos", CHAOS)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_short_campaign_loses_and_duplicates_nothing(pg_url: str, kafka_bootstrap: str, tmp_path: Path) -> None:
    chaos = _chaos()
    cfg = chaos.CampaignConfig(database_url=pg_url, bootstrap=kafka_bootstrap, rounds=4,
                               faults=("kill", "zombie", "terminate", "poison"), zombie_s=2.0, settle_s=0.5,
                               log_dir=tmp_path)
    report = chaos.run_campaign(cfg, progress=lambda _msg: None)
    figures = report.figures()
    assert [r.fault for r in report.rounds] == ["kill", "zombie", "terminate", "poison"]
    assert all(r.recovery_s is not None for r in report.rounds), figures
    assert report.acked > 100, figures
    assert report.lost == 0, figures
    assert report.duplicated == 0, figures
    assert report.unexpected == 0, figures
    assert report.dead_letters_expected == report.dead_letters_got, figures
    assert len(report.dead_letters_expected) >= 12, "poison of every kind"
    assert report.calls_checked > 50
    assert report.calls_exact == report.calls_checked
    assert report.projection_equal
    assert report.clean_shutdowns == report.shutdowns == 2, (figures, [p.read_text()[-3000:] for p in
                                                                       tmp_path.glob("*.log")])
    assert report.ok


def test_campaign_round_with_a_broker_restart(pg_url: str, kafka_bootstrap: str, tmp_path: Path) -> None:
    """The broker fault: the test broker restarted while the producer writes and two ingest processes read."""
    from tests.support.services import ServicesUnavailable, load_state, restart_kafka

    try:
        load_state()
    except ServicesUnavailable as exc:
        pytest.skip(f"the broker is not ours to restart: {exc}")
    chaos = _chaos()
    cfg = chaos.CampaignConfig(database_url=pg_url, bootstrap=kafka_bootstrap, rounds=2, faults=("broker", "kill"),
                               settle_s=0.5, broker_restart=restart_kafka, log_dir=tmp_path)
    report = chaos.run_campaign(cfg, progress=lambda _msg: None)
    figures = report.figures()
    assert all(r.recovery_s is not None for r in report.rounds), figures
    assert report.acked > 50, figures
    assert report.lost == 0, figures
    assert report.duplicated == 0, figures
    assert report.unexpected == 0, figures
    assert report.calls_exact == report.calls_checked, figures
    assert report.projection_equal, figures
    assert not report.dead_letters_got, figures
