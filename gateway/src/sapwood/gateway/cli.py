"""``sapwood gateway``: the recording proxy in front of OpenAI-compatible inference servers."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

#: Seconds a thread may hold the GIL while another waits for it (Python's default: 0.005).
GIL_SWITCH_INTERVAL_S = 0.0005
JOURNAL_HELP = ("session journal: every recorded event is appended here before it is queued, so a restarted "
                "gateway continues the sessions it had open")


def gateway(
    upstream: Annotated[
        list[str],
        typer.Option("--upstream", help="upstream base URL (repeatable; a session stays on one, by hash of its id)"),
    ],
    host: Annotated[str, typer.Option(help="interface to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port to listen on")] = 8100,
    database_url: Annotated[
        str | None,
        typer.Option(
            "--database-url", envvar="SAPWOOD_DATABASE_URL", help="store for embedded recording (default ./sapwood.db)"
        ),
    ] = None,
    bootstrap: Annotated[
        str | None,
        typer.Option(
            "--bootstrap", envvar="SAPWOOD_KAFKA_BOOTSTRAP", help="Kafka host:port (production); unset: embedded store"
        ),
    ] = None,
    run_id: Annotated[str, typer.Option(help="run of sessions that send no X-Run-Id header")] = "gateway",
    engine: Annotated[str, typer.Option(help="engine name recorded with each execution")] = "vllm",
    idle_timeout: Annotated[float, typer.Option(help="seconds until an idle session ends as 'timeout'")] = 600.0,
    ack: Annotated[
        str,
        typer.Option(help="async: answer once the call's events are queued; durable: once the transport "
                     "acknowledged them (Kafka acks=all / the SQLite commit)"),
    ] = "async",
    fail_open: Annotated[
        bool,
        typer.Option("--fail-open", help="while recording is unavailable, forward calls unrecorded (counted) "
                     "instead of answering 429"),
    ] = False,
    max_pending: Annotated[int, typer.Option(help="events not yet stored above which calls get 429")] = 10_000,
    batch_size: Annotated[int, typer.Option(help="events per transaction / flush of the background recorder")] = 256,
    retry_after: Annotated[int, typer.Option(help="seconds in the Retry-After header of a 429")] = 1,
    max_attempts: Annotated[int, typer.Option(help="upstreams tried per call on 5xx / connection errors")] = 2,
    transport_timeout: Annotated[
        float, typer.Option(help="seconds a batch may wait for the transport's acknowledgement before calls get 429")
    ] = 5.0,
    drain_timeout: Annotated[
        float, typer.Option(help="seconds shutdown waits for queued events to be delivered (then fails loudly)")
    ] = 30.0,
    max_ingest_lag: Annotated[
        int | None,
        typer.Option(help="records the ingest consumer group may be behind the topic before calls get 429 "
                     "(Kafka only; unset: not watched)"),
    ] = None,
    ingest_group: Annotated[
        str | None, typer.Option(envvar="SAPWOOD_INGEST_GROUP", help="the ingest's consumer group (lag is read for it)")
    ] = None,
    lag_interval: Annotated[float, typer.Option(help="seconds between two ingest-lag readings")] = 2.0,
    journal: Annotated[str, typer.Option(help=JOURNAL_HELP)] = "sapwood-gateway.journal",
    no_journal: Annotated[
        bool, typer.Option("--no-journal", help="no session journal (a restart starts new executions)")
    ] = False,
    journal_fsync: Annotated[
        bool, typer.Option("--journal-fsync", help="force each journal append to the disk (power loss)")
    ] = False,
    upstream_model_dir: Annotated[
        str | None,
        typer.Option(help="the upstream's model folder (its tokenizer.json): recorded with each execution so "
                     "audits and the viewer show text per token; unset: the folder the upstream's /v1/models "
                     "names, when it is readable here"),
    ] = None,
) -> None:
    """Proxy /v1/completions, /v1/chat/completions and /generate to the upstreams; record every call as TITO events."""
    import uvicorn

    from sapwood.gateway.app import GatewayConfig, create_app
    from sapwood.gateway.ingest_lag import KafkaGroupLag
    from sapwood.platform.settings import Settings
    from sapwood.rollout.transports import make_transport

    try:
        config = GatewayConfig(
            upstreams=list(upstream), run_id=run_id, engine=engine, idle_timeout_s=idle_timeout, ack=ack,
            fail_open=fail_open, max_pending=max_pending, batch_size=batch_size, retry_after_s=retry_after,
            max_attempts=max_attempts, transport_timeout_s=transport_timeout, drain_timeout_s=drain_timeout,
            max_ingest_lag=max_ingest_lag, lag_interval_s=lag_interval,
            journal_path=None if no_journal else journal, journal_fsync=journal_fsync,
            upstream_model_dir=upstream_model_dir,
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    overrides = {k: v for k, v in {"database_url": database_url, "kafka_bootstrap": bootstrap}.items() if v}
    settings = Settings(**overrides)  # type: ignore[arg-type]
    lag_reader = None
    if max_ingest_lag is not None:
        if not settings.kafka_bootstrap:
            raise typer.BadParameter("--max-ingest-lag watches the ingest's Kafka consumer group: give --bootstrap")
        group = ingest_group or settings.ingest_group
        lag_reader = KafkaGroupLag(settings.kafka_bootstrap, settings.kafka_topic, group)
    # embedded: the background recorder commits each of its batches in one transaction
    transport = (
        make_transport(settings) if settings.kafka_bootstrap else make_transport(settings, batch_size=batch_size)
    )
    # the background recorder's thread (store writes) holds the GIL in turns with the event loop; Python's
    # default 5 ms switch interval then adds up to 5 ms to a call waiting for it (docs/gateway.md, Benchmark)
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    try:
        uvicorn.run(create_app(config, transport, ingest_lag=lag_reader), host=host, port=port, log_level="warning")
    finally:
        transport.close()


def register(app: typer.Typer) -> None:
    """Add the ``gateway`` command to the ``sapwood`` CLI."""
    app.command("gateway")(gateway)


__all__ = ["gateway", "register"]
