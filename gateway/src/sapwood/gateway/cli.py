"""``sapwood gateway``: the recording proxy in front of OpenAI-compatible inference servers."""

from __future__ import annotations

from typing import Annotated

import typer


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
) -> None:
    """Proxy /v1/completions, /v1/chat/completions and /generate to the upstreams; record every call as TITO events."""
    import uvicorn

    from sapwood.gateway.app import GatewayConfig, create_app
    from sapwood.platform.settings import Settings
    from sapwood.rollout.transports import make_transport

    try:
        config = GatewayConfig(
            upstreams=list(upstream), run_id=run_id, engine=engine, idle_timeout_s=idle_timeout, ack=ack,
            fail_open=fail_open, max_pending=max_pending, batch_size=batch_size, retry_after_s=retry_after,
            max_attempts=max_attempts,
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    overrides = {k: v for k, v in {"database_url": database_url, "kafka_bootstrap": bootstrap}.items() if v}
    settings = Settings(**overrides)  # type: ignore[arg-type]
    # embedded: the background recorder commits each of its batches in one transaction
    transport = (
        make_transport(settings) if settings.kafka_bootstrap else make_transport(settings, batch_size=batch_size)
    )
    try:
        uvicorn.run(create_app(config, transport), host=host, port=port, log_level="warning")
    finally:
        transport.close()


def register(app: typer.Typer) -> None:
    """Add the ``gateway`` command to the ``sapwood`` CLI."""
    app.command("gateway")(gateway)


__all__ = ["gateway", "register"]
