"""sapwood.ingest: Kafka → store, exactly once; dead letters; Prometheus metrics."""

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
