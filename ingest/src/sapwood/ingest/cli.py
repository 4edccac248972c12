"""``sapwood ingest``: run the Kafka → store ingest service until SIGTERM/SIGINT."""

from __future__ import annotations

import logging
import signal
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
) -> None:
    """Consume TITO events from Kafka into the store, exactly once (offsets live in the store)."""
    # Handle SIGTERM from the first moment: a stop requested during start-up is honoured
    # as soon as the service exists (exit 0), instead of the default abrupt termination.
    stop_requested = threading.Event()
    services: list[Any] = []

    def _stop(signum: int, _frame: Any) -> None:
        logging.getLogger(__name__).info("signal %d: finishing the current batch", signum)
        stop_requested.set()
        for svc in services:
            svc.stop()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    from sapwood.ingest.service import IngestConfig, IngestService

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("kafka").setLevel(logging.WARNING)
    try:
        config = IngestConfig.from_settings(
            database_url=database_url, bootstrap=bootstrap, topic=topic, group=group, batch_size=batch_size,
            metrics_port=metrics_port, dead_letter_topic=dead_letter_topic, max_event_bytes=max_event_bytes,
            partitions=partitions, instance_id=instance_id, application_name=application_name,
            metrics_addr=metrics_addr, max_batch_bytes=max_batch_bytes,
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    service = IngestService(config)
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
