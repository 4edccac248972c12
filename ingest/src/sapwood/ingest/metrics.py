"""Prometheus metrics of the ingest service (one registry per service instance)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server


class IngestMetrics:
    """Counters are totals: events/s and tokens/s are their ``rate()``."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.events = Counter("sapwood_ingest_events", "Events applied to the store", registry=r)
        self.tokens = Counter("sapwood_ingest_tokens", "Token ids carried by applied events", registry=r)
        self.duplicates = Counter("sapwood_ingest_duplicates", "Events skipped as already stored", registry=r)
        self.dead_letters = Counter("sapwood_ingest_dead_letters", "Records sent to the dead letters", ["reason"],
                                    registry=r)
        self.batches = Counter("sapwood_ingest_batches", "Committed ingest transactions", registry=r)
        self.retries = Counter("sapwood_ingest_retries", "Batches rolled back and re-read from stored offsets",
                               registry=r)
        self.rebalances = Counter("sapwood_ingest_rebalances",
                                  "Partition assignments received (one per rebalance this process takes part in)",
                                  registry=r)
        self.lag = Gauge("sapwood_ingest_lag", "Log-end offset minus stored offset", ["topic", "partition"],
                         registry=r)
        self.apply_seconds = Histogram(
            "sapwood_ingest_apply_seconds", "Seconds per ingest transaction (decode, apply, offsets, commit)",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0), registry=r,
        )
        self._server: Any = None

    def serve(self, port: int, addr: str = "127.0.0.1") -> None:
        """Expose ``/metrics`` on ``addr:port`` (loopback by default; ``0.0.0.0`` for every interface)."""
        self._server, _thread = start_http_server(port, addr=addr, registry=self.registry)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


__all__ = ["IngestMetrics"]
