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
    statement_timeout_ms: int = Field(default=30_000, description="PostgreSQL statement_timeout per session")
    context_cache_nodes: int = Field(default=200_000, description="nodes whose prefix hash state is cached")
