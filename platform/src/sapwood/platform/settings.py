"""Settings from the environment (prefix ``SAPWOOD_``); backends are chosen here, never in code."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Runtime configuration shared by every Sapwood process."""

    model_config = SettingsConfigDict(env_prefix="SAPWOOD_", extra="ignore")

    database_url: str = Field(
        default_factory=lambda: f"sqlite:///{Path.cwd() / 'sapwood.db'}",
        description="SQLAlchemy URL of the store; SQLite file (embedded) or postgresql+psycopg://...",
    )
    kafka_bootstrap: str | None = Field(default=None, description="host:port of Kafka; None = in-process")
    kafka_topic: str = Field(default="sapwood.events", description="topic carrying TITO events")
    kafka_dead_letter_topic: str = Field(default="sapwood.dead-letters", description="dead-letter topic")
    kafka_partitions: int = Field(default=8, description="partitions of the event topic when ingest creates it")
    max_event_bytes: int = Field(
        default=1_000_000,
        description="largest encoded event: recorders split or refuse bigger ones, ingest dead-letters them "
        "(keep ≤ the topic's max.message.bytes)",
    )
    ingest_group: str = Field(default="sapwood-ingest", description="Kafka consumer group of the ingest service")
    ingest_batch_size: int = Field(default=500, description="records applied per ingest transaction (at most)")
    metrics_port: int | None = Field(default=None, description="port of the Prometheus /metrics endpoint")
    statement_timeout_ms: int = Field(default=30_000, description="PostgreSQL statement_timeout per session")
    context_cache_nodes: int = Field(default=200_000, description="nodes whose prefix hash state is cached")
