"""Topic administration and the lag readers (stored offsets vs log-end offsets)."""

from __future__ import annotations

import logging
import warnings
from typing import Any

from sqlalchemy.engine import Engine

from sapwood.platform.storage.backends import offset_store

log = logging.getLogger(__name__)

#: The broker's default ``message.max.bytes``.
BROKER_DEFAULT_MAX_MESSAGE_BYTES = 1_048_588


def _kafka() -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import kafka
    return kafka


def ensure_topics(bootstrap: str, topics: dict[str, int], *, max_event_bytes: int | None = None) -> None:
    """Create the missing ``topics`` (name → partitions); existing topics are left as they are.

    When ``max_event_bytes`` exceeds the broker default, the new topics get a matching
    ``max.message.bytes``.
    """
    kafka = _kafka()
    configs = {}
    if max_event_bytes and max_event_bytes + 1024 > BROKER_DEFAULT_MAX_MESSAGE_BYTES:
        configs["max.message.bytes"] = str(max_event_bytes + 1024)
    admin = kafka.KafkaAdminClient(bootstrap_servers=bootstrap, client_id="sapwood-admin")
    try:
        existing = set(admin.list_topics())
        missing = {name: n for name, n in topics.items() if name not in existing}
        if missing:
            admin.create_topics({name: {"num_partitions": n, "configs": configs} for name, n in missing.items()},
                                raise_errors=False, wait_for_metadata=True)
            log.info("created topics %s", sorted(missing))
    finally:
        admin.close()


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    """Log-end offset of every partition of ``topic``."""
    kafka = _kafka()
    consumer = kafka.KafkaConsumer(bootstrap_servers=bootstrap, client_id="sapwood-lag", enable_auto_commit=False)
    try:
        parts = consumer.partitions_for_topic(topic) or set()
        tps = [kafka.TopicPartition(topic, p) for p in sorted(parts)]
        return {tp.partition: int(off) for tp, off in consumer.end_offsets(tps).items()} if tps else {}
    finally:
        consumer.close()


def ingest_lag(bootstrap: str, topic: str, group: str, engine: Engine) -> dict[int, int]:
    """Records per partition not yet in the store: log-end offset − stored next offset."""
    ends = end_offsets(bootstrap, topic)
    with engine.connect() as conn:
        stored = offset_store(conn).read(conn, group, topic)
    return {p: end - stored.get(p, 0) for p, end in ends.items()}


__all__ = ["end_offsets", "ensure_topics", "ingest_lag"]
