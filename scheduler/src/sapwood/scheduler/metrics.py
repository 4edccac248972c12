"""Prometheus gauges of the scheduler's signals and decisions (one registry per loop instance)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from sapwood.platform.events.cells import CELL_ROLES
from sapwood.scheduler.signals import Signals


class SchedulerMetrics:
    """Every signal of a tick as a gauge; moves and decision latency as a counter and a histogram."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry

        def gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> Gauge:
            return Gauge(f"sapwood_scheduler_{name}", doc, list(labels), registry=r)

        self.lag = gauge("ingest_lag", "Kafka log-end offset minus the offset stored in the store",
                         ("topic", "partition"))
        self.backlog_executions = gauge("backlog_executions", "Finished executions not yet claimed", ("run_id",))
        self.backlog_tokens = gauge("backlog_tokens", "Trainable (model output) tokens of the backlog", ("run_id",))
        self.in_flight = gauge("in_flight_executions", "Executions still running")
        self.in_flight_age = gauge("in_flight_oldest_age_seconds", "Age of the oldest running execution")
        self.rollout_tps = gauge("rollout_tokens_per_second", "Output tokens of executions finished per second")
        self.learner_tps = gauge("learner_tokens_per_second", "Output tokens of items trained per second")
        self.staleness = gauge("staleness_max", "Policy versions the oldest backlog trajectory lags")
        self.cells = gauge("cells", "Cells by role (lost cells counted apart)", ("role",))
        self.cells_lost = gauge("cells_lost", "Cells whose heartbeat is older than the timeout")
        self.switch_cost = gauge("switch_cost_mean_seconds", "Rolling mean of measured switch durations")
        self.moves = Counter("sapwood_scheduler_moves", "CellRole changes decided", ["to_role"], registry=r)
        self.decision_seconds = Histogram(
            "sapwood_scheduler_decision_seconds", "Signals read + policy per tick",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0), registry=r,
        )
        self._server: Any = None

    def observe(self, s: Signals) -> None:
        for p in s.ingest_lag:
            self.lag.labels(p.topic, str(p.partition)).set(p.lag)
        for b in s.backlog_by_run:
            self.backlog_executions.labels(b.run_id).set(b.executions)
            self.backlog_tokens.labels(b.run_id).set(b.tokens)
        self.in_flight.set(s.in_flight)
        self.in_flight_age.set(s.in_flight_oldest_age_s)
        self.rollout_tps.set(s.rollout_tokens_per_s)
        self.learner_tps.set(s.learner_tokens_per_s)
        self.staleness.set(s.staleness_max)
        for role in CELL_ROLES:
            self.cells.labels(role).set(sum(1 for c in s.cells if c.role == role and not c.lost))
        self.cells_lost.set(sum(1 for c in s.cells if c.lost))
        self.switch_cost.set(s.switch_cost_mean_s)

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        self._server, _thread = start_http_server(port, addr=addr, registry=self.registry)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server = None
