"""Ingest configuration and CLI wiring (no servers)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from sapwood.ingest import IngestConfig
from sapwood.ingest.classifier import connection_lost
from sapwood.platform.cli import app
from sapwood.platform.errors import StoreError, StoreUnavailableError
from sapwood.platform.settings import Settings


def test_config_from_sapwood_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SAPWOOD_KAFKA_BOOTSTRAP", "broker:9092")
    monkeypatch.setenv("SAPWOOD_INGEST_GROUP", "g1")
    monkeypatch.setenv("SAPWOOD_MAX_EVENT_BYTES", "2000000")
    config = IngestConfig.from_settings(Settings(), batch_size=77, topic=None)
    assert (config.bootstrap, config.group, config.batch_size, config.max_event_bytes) == ("broker:9092", "g1", 77,
                                                                                          2_000_000)
    assert config.topic == "sapwood.events"


def test_config_needs_a_broker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SAPWOOD_KAFKA_BOOTSTRAP", raising=False)
    with pytest.raises(ValueError, match="bootstrap"):
        IngestConfig.from_settings(Settings())


def test_ingest_command_is_registered() -> None:
    result = CliRunner().invoke(app, ["ingest", "--help"])
    assert result.exit_code == 0
    for option in ("--database-url", "--bootstrap", "--topic", "--group", "--batch-size", "--metrics-port"):
        assert option in result.output




def test_connection_errors_are_told_apart_from_bad_records() -> None:
    try:
        try:
            raise OSError("server closed the connection")
        except OSError as exc:
            raise StoreUnavailableError("database unavailable") from exc
    except StoreUnavailableError as exc:
        assert connection_lost(exc)
    assert not connection_lost(StoreError("value too long for type character varying(128)"))
    assert not connection_lost(ValueError("bug"))
