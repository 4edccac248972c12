"""Settings of one ingest process (:class:`IngestConfig`) and its database URL."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sapwood.ingest.membership import AUTO
from sapwood.platform.settings import Settings


@dataclass
class IngestConfig:
    """Settings of one ingest process."""

    database_url: str
    """SQLAlchemy URL of the store (PostgreSQL in production)."""
    bootstrap: str
    """Kafka ``host:port``."""
    topic: str = "sapwood.events"
    group: str = "sapwood-ingest"
    """Consumer group; processes of one group split the topic's partitions."""
    dead_letter_topic: str | None = "sapwood.dead-letters"
    """Topic that gets a copy of every dead letter (None: table only)."""
    batch_size: int = 500
    """Most records per transaction."""
    batch_wait_ms: int = 50
    """After a poll, keep polling this long to fill the transaction up to ``batch_size``."""
    max_event_bytes: int = 1_000_000
    """Records larger than this are dead-lettered as ``too_large`` without decoding, and so are records
    whose payload decompresses to more (never inflated past this bound)."""
    max_batch_bytes: int | None = None
    """Most bytes a compressed Kafka record batch may inflate to (None: max(64 MiB, 4 × max_event_bytes));
    a larger batch's offsets are dead-lettered as ``too_large`` (see :mod:`kafka_bounds`)."""
    partitions: int = 8
    """Partitions of the topics when this process creates them (0: never create topics)."""
    instance_id: str | None = None
    """Static group membership: a restarted process with the same id gets its partitions back at once.
    ``"auto"`` derives ``sapwood-ingest-<host>-<index>`` (the CLI's default, see :mod:`membership`);
    None: dynamic membership (a stopped member's partitions move at once, a restarted one rejoins)."""
    application_name: str = "sapwood-ingest"
    """PostgreSQL ``application_name`` of the ingest's connections."""
    poll_timeout_ms: int = 200
    session_timeout_ms: int = 10_000
    heartbeat_interval_ms: int = 1_000
    lag_interval_s: float = 2.0
    """How often the lag gauge is refreshed (asks the broker for log-end offsets)."""
    retry_backoff_s: float = 0.2
    max_backoff_s: float = 5.0
    metrics_port: int | None = None
    metrics_addr: str = "127.0.0.1"
    """Interface of the ``/metrics`` server (loopback unless configured, e.g. ``0.0.0.0``)."""
    stall_after_s: float = 60.0
    """``/healthz`` answers 503 when a partition with lag > 0 made no progress, or the main loop took no
    step, for this many seconds."""
    watchdog_s: float = 300.0
    """The CLI's watchdog exits the process (status 70) when the main loop took no step for this long."""
    stop_timeout_s: float = 30.0
    """The CLI exits (status 71) if SIGTERM/SIGINT has not ended the process within this many seconds."""
    commit_to_kafka: bool = True
    """Also commit offsets to Kafka after the database commit (for lag tooling)."""
    migrate: bool = True
    cache_nodes: int = 200_000
    consumer_config: dict[str, Any] = field(default_factory=dict)
    """Extra kafka-python ``KafkaConsumer`` settings."""

    @classmethod
    def from_settings(cls, settings: Settings | None = None, **overrides: Any) -> IngestConfig:
        """Defaults from ``SAPWOOD_*`` settings; ``overrides`` that are None are ignored."""
        s = settings or Settings()
        values: dict[str, Any] = {
            "database_url": s.database_url,
            "bootstrap": s.kafka_bootstrap,
            "topic": s.kafka_topic,
            "group": s.ingest_group,
            "dead_letter_topic": s.kafka_dead_letter_topic,
            "batch_size": s.ingest_batch_size,
            "max_event_bytes": s.max_event_bytes,
            "partitions": s.kafka_partitions,
            "metrics_port": s.metrics_port,
            "cache_nodes": s.context_cache_nodes,
            "instance_id": AUTO,
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        if not values["bootstrap"]:
            raise ValueError("ingest needs a Kafka bootstrap server (--bootstrap or SAPWOOD_KAFKA_BOOTSTRAP)")
        return cls(**values)



__all__ = ["IngestConfig"]
