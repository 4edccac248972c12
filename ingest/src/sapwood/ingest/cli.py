"""``sapwood ingest``: run the Kafka → store ingest service until SIGTERM/SIGINT."""

from __future__ import annotations

import logging
import threading
from typing import Annotated, Any

import typer


def ingest(
    database_url: Annotated[str | None, typer.Option("--database-url", envvar="SAPWOOD_DATABASE_URL",
                                                     help="SQLAlchemy URL of the store")] = None,
    bootstrap: Annotated[str | None, typer.Option("--bootstrap", envvar="SAPWOOD_KAFKA_BOOTSTRAP",
                                                  help="Kafka host:port")] = None,
    topic: Annotated[str | None, typer.Option(help="event topic [SAPWOOD_KAFKA_TOPIC]")] = None,
    group: Annotated[str | None, typer.Option(help="consumer group [SAPWOOD_INGEST_GROUP]")] = None,
    batch_size: Annotated[int | None, typer.Option(help="most records per transaction")] = None,
    metrics_port: Annotated[int | None, typer.Option(help="serve Prometheus /metrics on this port")] = None,
    metrics_addr: Annotated[str, typer.Option(help="interface of /metrics (0.0.0.0: every interface)")] = "127.0.0.1",
    dead_letter_topic: Annotated[str | None, typer.Option(help="dead-letter topic")] = None,
    max_event_bytes: Annotated[int | None, typer.Option(help="larger records are dead-lettered (too_large)")] = None,
    max_batch_bytes: Annotated[int | None, typer.Option(
        help="most bytes a compressed Kafka record batch may inflate to [max(64 MiB, 4 x max-event-bytes)]")] = None,
    partitions: Annotated[int | None, typer.Option(help="partitions when creating the topic (0: never create)")] = None,
    instance_id: Annotated[str, typer.Option(
        help="static group membership id: 'auto' derives <host>-<index> (a restart gets its partitions back "
             "at once), 'none' joins dynamically (a stopped member's partitions move at once)")] = "auto",
    application_name: Annotated[str, typer.Option(help="PostgreSQL application_name")] = "sapwood-ingest",
    log_level: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING")] = "INFO",
    stall_after_s: Annotated[float | None, typer.Option(
        help="/healthz answers 503 when a partition with lag > 0 made no progress for this many seconds")] = None,
    watchdog_s: Annotated[float | None, typer.Option(
        help="exit with status 70 when the main loop took no step for this many seconds")] = None,
    stop_timeout_s: Annotated[float | None, typer.Option(
        help="exit with status 71 when SIGTERM has not ended the process within this many seconds")] = None,
) -> None:
    """Consume TITO events from Kafka into the store, exactly once (offsets live in the store)."""
    # Handle SIGTERM from the first moment, before any thread starts (they inherit the blocked mask):
    # a stop requested during start-up is honoured as soon as the service exists (exit 0), and a stop
    # that does not end the process within its bound exits with EXIT_STOP_TIMEOUT.
    from sapwood.ingest.config import IngestConfig
    from sapwood.ingest.liveness import Watchdog, install_stop_signals

    stop_requested = threading.Event()
    services: list[Any] = []

    def _stop(signum: int) -> None:
        logging.getLogger(__name__).info("signal %d: finishing the current batch", signum)
        stop_requested.set()
        for svc in services:
            svc.stop()

    bound = stop_timeout_s if stop_timeout_s is not None else IngestConfig.stop_timeout_s
    try:
        install_stop_signals(_stop, bound)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    from sapwood.ingest.service import IngestService

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("kafka").setLevel(logging.WARNING)
    try:
        config = IngestConfig.from_settings(
            database_url=database_url, bootstrap=bootstrap, topic=topic, group=group, batch_size=batch_size,
            metrics_port=metrics_port, dead_letter_topic=dead_letter_topic, max_event_bytes=max_event_bytes,
            partitions=partitions, instance_id=instance_id, application_name=application_name,
            metrics_addr=metrics_addr, max_batch_bytes=max_batch_bytes, stall_after_s=stall_after_s,
            watchdog_s=watchdog_s, stop_timeout_s=bound,
        )
        service = IngestService(config)
        watchdog = Watchdog(service.liveness, config.watchdog_s)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    watchdog.start()
    services.append(service)
    if stop_requested.is_set():
        service.stop()
    service.run()
    s = service.stats
    typer.echo(f"ingest stopped: {s.events} events, {s.tokens} tokens, {s.dead_letters} dead letters, "
               f"{s.retries} retries")


def register(app: typer.Typer) -> None:
    """Add the ``ingest`` command to the ``sapwood`` CLI."""
    app.command("ingest")(ingest)


def main() -> None:
    """``python -m sapwood.ingest``: the ingest command alone."""
    app = typer.Typer(add_completion=False)
    register(app)
    app()


__all__ = ["ingest", "main", "register"]
