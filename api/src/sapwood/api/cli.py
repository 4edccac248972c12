"""``sapwood serve`` and ``sapwood keys ...`` (registered into the platform CLI)."""

from __future__ import annotations

import json
import os
import secrets
import socket
import time
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from sapwood.platform.store import Store

# Not imported from sapwood.platform.cli: that module imports this one while it loads.
DatabaseOpt = Annotated[
    str | None,
    typer.Option("--database-url", envvar="SAPWOOD_DATABASE_URL", help="SQLAlchemy URL (default: ./sapwood.db)"),
]

keys_app = typer.Typer(help="API keys for the REST API.", no_args_is_help=True)


def _store(database_url: str | None) -> Store:
    from sapwood.api.config import ApiSettings
    from sapwood.platform.store import Store

    return Store.open(database_url or ApiSettings().database_url)


def serve(
    database_url: DatabaseOpt = None,
    host: Annotated[str | None, typer.Option(help="bind address (SAPWOOD_API_HOST, default 127.0.0.1)")] = None,
    port: Annotated[int | None, typer.Option(help="port (SAPWOOD_API_PORT, default 8000)")] = None,
    workers: Annotated[int | None, typer.Option(help="worker processes (SAPWOOD_API_WORKERS, default 1)")] = None,
    migrate: Annotated[bool, typer.Option(help="apply database migrations first")] = True,
    log_level: str = "info",
) -> None:
    """Run the REST API (uvicorn) over the store.

    The server itself runs in a fresh interpreter that imports only the API (see
    :mod:`sapwood.api.server`); this process migrates, binds the socket and then becomes that server.
    """
    from sapwood.api.config import ApiSettings
    from sapwood.api.server import exec_server

    if database_url:
        os.environ["SAPWOOD_DATABASE_URL"] = database_url  # the workers build their app from the environment
    if not os.environ.get("SAPWOOD_API_CURSOR_SECRET"):  # one secret for every worker: cursors work on any of them
        os.environ["SAPWOOD_API_CURSOR_SECRET"] = secrets.token_urlsafe(32)
    settings = ApiSettings()
    if migrate:
        _migrate(settings.database_url)
    sock = listen_socket(host or settings.api_host, port or settings.api_port)
    typer.echo(f"serving on http://{host or settings.api_host}:{sock.getsockname()[1]}", err=True)
    typer.echo(f"web viewer: http://{host or settings.api_host}:{sock.getsockname()[1]}/ui/", err=True)
    exec_server(sock.fileno(), workers=workers or settings.api_workers, log_level=log_level,
                max_header_bytes=settings.api_max_header_bytes)


def _migrate(database_url: str) -> None:
    """Apply migrations; retried, since another service (ingest) may be running the same migration."""
    from sapwood.platform.errors import StoreError
    from sapwood.platform.store import Store

    store = Store.open(database_url, migrate=False)
    try:
        for attempt in range(3):
            try:
                store.migrate()
                return
            except StoreError:
                if attempt == 2:
                    raise
                time.sleep(1.0)
    finally:
        store.close()


def listen_socket(host: str, port: int) -> socket.socket:
    """The listening socket, with TCP_NODELAY (inherited by every accepted connection on Linux).

    uvicorn's multi-worker mode shares a socket created without ``IPPROTO_TCP``, so asyncio skips
    its automatic TCP_NODELAY and small responses wait ~40 ms for delayed ACKs (Nagle); binding
    here and passing the descriptor avoids that for any worker count.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


@keys_app.command("create")
def keys_create(
    name: Annotated[str, typer.Option(help="who or what uses the key")],
    scopes: Annotated[str, typer.Option(help='space-separated subset of "read write admin"')] = "read",
    database_url: DatabaseOpt = None,
) -> None:
    """Create an API key and print it once (only its hash is stored)."""
    from sapwood.api.auth import create_key

    store = _store(database_url)
    with store.transaction() as conn:
        key, record = create_key(conn, name, scopes)
    typer.echo(key)
    typer.echo(f"key {record['key_id']} ({' '.join(record['scopes'])}) for {name!r}: store it now, it is not "
               "shown again", err=True)


@keys_app.command("list")
def keys_list(database_url: DatabaseOpt = None) -> None:
    """List API keys (ids, names, scopes; never secrets)."""
    from sapwood.api.auth import list_keys

    with _store(database_url).transaction() as conn:
        for record in list_keys(conn):
            typer.echo(json.dumps(record))


@keys_app.command("revoke")
def keys_revoke(key_id: str, database_url: DatabaseOpt = None) -> None:
    """Revoke an API key."""
    from sapwood.api.auth import revoke_key

    with _store(database_url).transaction() as conn:
        revoke_key(conn, key_id)
    typer.echo(f"revoked {key_id}")


def register(app: typer.Typer) -> None:
    """Add ``serve`` and ``keys`` to the ``sapwood`` command."""
    app.command("serve")(serve)
    app.add_typer(keys_app, name="keys")
