"""kill -9 of the gateway under load with --ack=durable: every answered call is stored exactly once."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.gateway_kill import kill_under_load

pytestmark = pytest.mark.kafka


def test_kill_9_under_load_with_durable_acks_loses_and_duplicates_no_answered_call(
    tmp_path: Path, pg_url: str, kafka_bootstrap: str
) -> None:
    figures = kill_under_load(kafka_bootstrap, pg_url, tmp_path, sessions=8, kill_after=60)
    assert figures.answered >= 60
    assert figures.lost == 0, figures
    assert figures.duplicated == 0, figures
    assert figures.stored == figures.answered + figures.stored_unanswered
    assert figures.stored_unanswered <= 8, "at most one call per client was in flight at the kill"
