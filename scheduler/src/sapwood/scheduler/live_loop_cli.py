"""``sapwood scheduler run``: the live loop against the store (and Kafka when configured)."""

from __future__ import annotations

import json
import logging
import signal
import threading
from typing import Annotated, Any

import typer


def run(
    database_url: Annotated[str | None, typer.Option("--database-url", envvar="SAPWOOD_DATABASE_URL")] = None,
    bootstrap: Annotated[str | None, typer.Option("--bootstrap", envvar="SAPWOOD_KAFKA_BOOTSTRAP",
                                                  help="Kafka host:port (lag signal and event transport)")] = None,
    topic: Annotated[str, typer.Option(envvar="SAPWOOD_KAFKA_TOPIC", help="event topic")] = "sapwood.events",
    group: Annotated[str, typer.Option(envvar="SAPWOOD_INGEST_GROUP", help="ingest consumer group")] = (
        "sapwood-ingest"
    ),
    policy: Annotated[str, typer.Option(help="built-in name (elastic, colocate, async) or import path")] = "elastic",
    policy_arg: Annotated[list[str] | None, typer.Option(help="policy parameter NAME=VALUE (repeatable)")] = None,
    batch_size: Annotated[int, typer.Option(min=1, help="trajectories per training step")] = 64,
    train_step_cell_s: Annotated[float, typer.Option(min=0, help="cell-seconds of one training step")] = 0.0,
    tick_s: Annotated[float, typer.Option(min=0.01, help="seconds between decisions")] = 10.0,
    ticks: Annotated[int, typer.Option(min=0, help="stop after this many ticks (0: until SIGTERM)")] = 0,
    lost_after_s: Annotated[float, typer.Option(min=0.1, help="a cell silent this long is lost")] = 30.0,
    metrics_port: Annotated[int | None, typer.Option(help="serve Prometheus /metrics on this port")] = None,
    actuator: Annotated[str, typer.Option(help="logging (moves nothing) or ray (moves the runtime's cells)")] = (
        "logging"
    ),
    ray_address: Annotated[str | None, typer.Option(help="Ray cluster to join (--actuator ray)")] = None,
    ray_prefix: Annotated[str, typer.Option(help="actor-name prefix of the elastic runtime")] = "sapwood",
    policy_run: Annotated[str | None, typer.Option(help="run whose newest published policy cells entering "
                                                        "rollout load (--actuator ray)")] = None,
) -> None:
    """Read the signals every tick, decide with POLICY, record each decision as a role_assigned event."""
    from sapwood.platform.settings import Settings
    from sapwood.platform.store import Store
    from sapwood.rollout.transports import InProcessTransport, KafkaTransport, Transport
    from sapwood.scheduler.live_loop import LoggingActuator, SchedulerLoop
    from sapwood.scheduler.live_signals import KafkaLag, LiveSignalReader
    from sapwood.scheduler.metrics import SchedulerMetrics
    from sapwood.scheduler.policy import load_policy

    if actuator not in ("logging", "ray"):
        raise typer.BadParameter(f"--actuator must be 'logging' or 'ray', got {actuator!r}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        pol = load_policy(policy, **parse_policy_args(policy_arg or []))
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    store = Store.open(database_url or Settings().database_url)
    lag = KafkaLag(bootstrap, topic, group) if bootstrap else None
    sink: Transport = KafkaTransport(bootstrap, topic=topic) if bootstrap else InProcessTransport(store, batch_size=1)
    reader = LiveSignalReader(store.engine, batch_size=batch_size, train_step_cell_s=train_step_cell_s, lag=lag,
                              lost_after_s=lost_after_s)
    metrics = SchedulerMetrics()
    if metrics_port is not None:
        metrics.serve(metrics_port)
    stop = threading.Event()

    def _stop(signum: int, _frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    act: Any = LoggingActuator()
    if actuator == "ray":
        from sapwood.learner.loop import latest_policy
        from sapwood.scheduler.runtime.actuator import RayActuator

        source = (lambda: latest_policy(store, policy_run)) if policy_run else None
        try:
            act = RayActuator.connect(ray_prefix, address=ray_address, policy_source=source)
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from None
        reader.queue = act.queue  # rollout demand from the router's queue lag
    loop = SchedulerLoop(reader.read, pol, sink, act, metrics)
    try:
        loop.run(tick_s, ticks, stop.is_set)
    finally:
        sink.close()
        reader.close()
        metrics.close()
        store.close()


def parse_policy_args(items: list[str]) -> dict[str, Any]:
    """``["min_dwell_s=30", "round_trip=false"]`` → ``{"min_dwell_s": 30, "round_trip": False}`` (JSON values)."""
    out: dict[str, Any] = {}
    for item in items:
        name, sep, raw = item.partition("=")
        if not sep or not name.isidentifier():
            raise ValueError(f"--policy-arg {item!r}: expected NAME=VALUE, e.g. min_dwell_s=30")
        try:
            out[name] = json.loads(raw)
        except json.JSONDecodeError:
            out[name] = raw
    return out


def register(app: typer.Typer) -> None:
    app.command("run")(run)
