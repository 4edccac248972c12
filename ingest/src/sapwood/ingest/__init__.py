"""sapwood.ingest: Kafka → store, exactly once; dead letters; Prometheus metrics."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sapwood.platform.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from sapwood.ingest.deadletters import DeadLetter
    from sapwood.ingest.metrics import IngestMetrics
    from sapwood.ingest.service import IngestConfig, IngestService, IngestStats
    from sapwood.ingest.topics import end_offsets, ensure_topics, ingest_lag

__all__ = [
    "DeadLetter",
    "IngestConfig",
    "IngestMetrics",
    "IngestService",
    "IngestStats",
    "end_offsets",
    "ensure_topics",
    "ingest_lag",
]

__getattr__ = lazy_exports(__name__, __all__, ("deadletters", "metrics", "service", "topics"))
