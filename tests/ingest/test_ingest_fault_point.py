"""``SAPWOOD_FAULT=ingest.after_apply``: an ingest process killed between applying a batch and storing its
offsets restarts from the stored offsets with nothing lost and nothing applied twice."""

from __future__ import annotations

from pathlib import Path

import pytest

from sapwood.platform.store import Store
from sapwood.platform.synthetic import SynthConfig, synthetic_execution
from sapwood.rollout import KafkaTransport
from tests.support.histories import SMALL
from tests.support.kafka_ingest import IngestProcess, Ledger, caught_up, check_exactly_once, create_topic, wait_until

pytestmark = pytest.mark.postgres


def test_ingest_killed_after_apply_before_the_offsets_restarts_exactly_once(
        pg_url: str, kafka_bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    topic = create_topic(kafka_bootstrap, 2)
    group = f"g-{topic}"
    store = Store.open(pg_url)
    ledger = Ledger()
    with KafkaTransport(kafka_bootstrap, topic=topic, on_delivery=ledger) as transport:
        for seed in range(6):
            for ev in synthetic_execution(SynthConfig(**{**SMALL.__dict__, "seed": 200 + seed})).events:
                transport.send(ev)
    assert ledger.acked
    assert not ledger.failed
    monkeypatch.setenv("SAPWOOD_FAULT", "ingest.after_apply@2")  # the first batch commits, the second dies
    crashed = IngestProcess(pg_url, kafka_bootstrap, topic, group, tmp_path / "crash.log", batch_size=20).start()
    assert crashed.proc is not None
    assert crashed.proc.wait(120) == -9, (tmp_path / "crash.log").read_text()
    assert not caught_up(store.engine, kafka_bootstrap, topic, group)  # the killed batch's offsets never stored
    monkeypatch.delenv("SAPWOOD_FAULT")
    restarted = IngestProcess(pg_url, kafka_bootstrap, topic, group, tmp_path / "restart.log", batch_size=20).start()
    try:
        wait_until(lambda: caught_up(store.engine, kafka_bootstrap, topic, group), 90, "the restart to catch up")
        assert restarted.terminate(30) == 0
    finally:
        restarted.ensure_dead()
    check_exactly_once(store, ledger.acked, bootstrap=kafka_bootstrap, topic=topic, group=group)
