"""kill -9 of the gateway under load: with --ack=durable every answered call is stored exactly once; with the
session journal a restarted gateway continues the open sessions (one execution, one tree, nothing lost)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.gateway_kill import kill_under_load
from tests.support.gateway_restart import kill_and_restart
from tests.support.private_kafka import private_broker

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


@pytest.mark.parametrize("ack", ["durable", "async"])
def test_sessions_open_across_a_kill_9_go_on_as_one_execution_after_a_restart(
    tmp_path: Path, pg_url: str, kafka_bootstrap: str, ack: str
) -> None:
    figures = kill_and_restart(kafka_bootstrap, pg_url, tmp_path, ack=ack, sessions=4, kill_after=24, calls_after=3)
    assert figures.resumed == 4, figures
    assert figures.executions == {f"restart{k}": 1 for k in range(4)}, "one execution per session"
    assert figures.statuses == {f"restart{k}": ["success"] for k in range(4)}, figures
    assert figures.roots == {f"restart{k}": 1 for k in range(4)}, "one tree per session"
    assert figures.answered >= 24 + 4 * 3
    assert figures.lost == 0, figures
    assert figures.duplicated == 0, figures
    assert figures.wrong_inputs == 0, figures
    assert figures.dead_letters == 0, figures
    assert figures.stored_unanswered <= 4, "at most one call per client was in flight at the kill"


def test_calls_answered_while_kafka_was_down_reach_the_store_through_the_restarted_gateway(
    tmp_path: Path, pg_url: str
) -> None:
    """--ack=async: the calls answered after the broker stopped are only in the journal when the gateway is
    killed; the restarted gateway sends them again once the broker is back."""
    with private_broker(tmp_path / "kafka") as broker:
        figures = kill_and_restart(broker.bootstrap, pg_url, tmp_path, ack="async", sessions=4, kill_after=12,
                                   calls_after=2, outage=broker)
    assert figures.executions == {f"restart{k}": 1 for k in range(4)}, figures
    assert figures.roots == {f"restart{k}": 1 for k in range(4)}, figures
    assert figures.lost == 0, figures
    assert figures.duplicated == 0, figures
    assert figures.wrong_inputs == 0, figures
    assert figures.dead_letters == 0, figures
