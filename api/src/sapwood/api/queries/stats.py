"""Store statistics and ingest lag (Kafka log-end offset minus the offset the store committed)."""

from __future__ import annotations

import threading
import time
import warnings
from typing import Any

from sqlalchemy.engine import Connection

from sapwood.platform.storage import store_stats as reads
from sapwood.platform.storage.offsets import all_offsets
from sapwood.platform.store import Store


def store_stats(store: Store) -> dict[str, Any]:
    """The platform's store statistics plus unique (content-addressed) token counts."""
    stats = store.stats()
    with store.engine.connect() as conn:
        unique = reads.unique_tokens(conn)
    tree = int(stats["tree_tokens"])
    return {**stats, "unique_tokens": unique, "span_dedup_ratio": round(tree / unique, 3) if unique else None}


def stored_offsets(conn: Connection) -> list[dict[str, Any]]:
    return all_offsets(conn)


def kafka_end_offsets(bootstrap: str, topic_partitions: list[tuple[str, int]],
                      timeout_s: float) -> dict[tuple[str, int], int]:
    """Log-end offsets from the broker (raises when it cannot be reached within ``timeout_s``)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from kafka import KafkaConsumer, TopicPartition

    timeout_ms = max(1000, int(timeout_s * 1000))
    config = {"group_id": None, "enable_auto_commit": False, "client_id": "sapwood-api-lag",
              "request_timeout_ms": timeout_ms,
              # the first-contact timeout is named differently across kafka-python versions
              "api_version_auto_timeout_ms": timeout_ms, "bootstrap_timeout_ms": timeout_ms}
    known = KafkaConsumer.DEFAULT_CONFIG
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, **{k: v for k, v in config.items() if k in known})
    try:
        tps = [TopicPartition(topic, p) for topic, p in topic_partitions]
        ends = consumer.end_offsets(tps, timeout_ms=timeout_ms)
        return {(tp.topic, tp.partition): int(off) for tp, off in ends.items()}
    finally:
        consumer.close()


class LagReader:
    """Ingest lag from ``consumer_offsets`` and the broker, cached for ``ttl_s`` seconds."""

    def __init__(self, bootstrap: str | None, *, timeout_s: float = 3.0, ttl_s: float = 5.0) -> None:
        self.bootstrap = bootstrap
        self.timeout_s = timeout_s
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._cached: tuple[float, dict[str, Any]] | None = None

    def read(self, conn: Connection) -> dict[str, Any]:
        """``{"ingest_lag": int | None, "ingest_lag_partitions": [...] | None, "ingest_lag_reason": str | None}``."""
        with self._lock:
            if self._cached and time.monotonic() - self._cached[0] < self.ttl_s:
                return self._cached[1]
        result = self._measure(conn)
        with self._lock:
            self._cached = (time.monotonic(), result)
        return result

    def _measure(self, conn: Connection) -> dict[str, Any]:
        none: dict[str, Any] = {"ingest_lag": None, "ingest_lag_partitions": None}
        if not self.bootstrap:
            return {**none, "ingest_lag_reason": "Kafka is not configured (SAPWOOD_KAFKA_BOOTSTRAP is unset); "
                                                 "events reach the store in-process"}
        offsets = stored_offsets(conn)
        if not offsets:
            return {**none, "ingest_lag_reason": "no consumer offsets stored yet (ingest has not committed a batch)"}
        try:
            ends = kafka_end_offsets(self.bootstrap, sorted({(o["topic"], o["partition"]) for o in offsets}),
                                     self.timeout_s)
        except Exception as exc:  # any client failure means "not measurable now", never a failed request
            return {**none, "ingest_lag_reason": f"Kafka at {self.bootstrap} is unreachable ({type(exc).__name__})"}
        parts = []
        for o in offsets:
            end = ends.get((o["topic"], o["partition"]))
            if end is None:
                continue
            parts.append({**o, "end_offset": end, "lag": max(0, end - int(o["next_offset"]))})
        if not parts:
            return {**none, "ingest_lag_reason": "the broker did not report end offsets for the stored partitions"}
        return {"ingest_lag": sum(p["lag"] for p in parts), "ingest_lag_partitions": parts, "ingest_lag_reason": None}
