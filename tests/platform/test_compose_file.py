"""docker-compose.yml parses and every service says when it is healthy."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import yaml

COMPOSE = Path(__file__).resolve().parents[2] / "docker-compose.yml"


def _services() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict)
    services = data.get("services")
    assert isinstance(services, dict)
    assert services
    return services


def test_postgres_and_kafka_are_defined() -> None:
    services = _services()
    assert str(services["postgres"]["image"]).startswith("postgres:16")
    assert str(services["kafka"]["image"]).startswith("apache/kafka:4.")


def test_every_service_has_a_healthcheck() -> None:
    for name, service in _services().items():
        check = service.get("healthcheck")
        assert isinstance(check, dict), f"service {name} has no healthcheck"
        test = check.get("test")
        assert test, f"service {name} healthcheck has no test"
        assert not check.get("disable", False), f"service {name} disables its healthcheck"


def test_healthchecks_probe_the_real_servers() -> None:
    services = _services()
    assert "pg_isready" in " ".join(services["postgres"]["healthcheck"]["test"])
    kafka_check = " ".join(services["kafka"]["healthcheck"]["test"])
    assert "kafka-broker-api-versions.sh" in kafka_check or "kafka-topics.sh" in kafka_check


def test_kafka_is_a_single_kraft_node() -> None:
    env = _services()["kafka"]["environment"]
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert str(env["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"]) == "1"
    assert str(env["KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS"]) == "0"


def test_published_ports_are_loopback_only() -> None:
    for name, service in _services().items():
        for port in service.get("ports", []):
            spec = port if isinstance(port, str) else f"{port.get('host_ip', '')}:{port.get('published')}"
            assert spec.startswith("127.0.0.1:"), f"service {name} publishes {spec!r} beyond loopback"


def test_kafka_cluster_id_is_a_valid_kraft_id() -> None:
    cluster_id = str(_services()["kafka"]["environment"]["CLUSTER_ID"])
    assert len(cluster_id) == 22
    assert len(base64.urlsafe_b64decode(cluster_id + "==")) == 16
