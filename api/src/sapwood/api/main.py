"""The FastAPI application factory (``uvicorn sapwood.api.main:create_app --factory``)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import anyio.to_thread
from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from sapwood.api import gc_policy, timing
from sapwood.api.auth import KeyVerifier
from sapwood.api.cache import LRU, ResponseCache
from sapwood.api.config import ApiSettings
from sapwood.api.cursors import Cursors
from sapwood.api.db import open_store
from sapwood.api.deps import Services
from sapwood.api.errors import install_error_handlers
from sapwood.api.export_pool import open_export_pool
from sapwood.api.middleware import (
    AllowHeaderMiddleware,
    BodySizeLimitMiddleware,
    HeaderLimitMiddleware,
    KeyBeforeBodyMiddleware,
    RelativeRedirectMiddleware,
)
from sapwood.api.queries.stats import LagReader
from sapwood.api.recorded_tokenizer import RecordedTokenizers
from sapwood.api.routes import calls, executions, export, health, keys, nodes, prompts, runs, scheduler, stats
from sapwood.api.tokenizer import load_tokenizer
from sapwood.api.ui import mount_ui
from sapwood.api.versions import VersionReader
from sapwood.platform.store import Store

DESCRIPTION = """\
Queries over Sapwood's trajectory trees, exact-context audits of model calls, replay of historical
rollouts into new training runs, and Parquet export.

Every `/v1` route needs an API key (`sapwood keys create --name NAME --scopes "read write"`), sent as
`Authorization: Bearer <key_id>.<secret>` or `X-API-Key: <key_id>.<secret>`. Scopes: `read` for
queries, `write` for new runs and score revisions, `admin` for key management. Errors are
`{"error": {"code": ..., "message": ...}}`. A body that is not UTF-8 JSON gets 400, headers larger
than `SAPWOOD_API_MAX_HEADER_BYTES` 431, bodies larger than `SAPWOOD_API_MAX_BODY_BYTES` 413.
Pagination cursors are signed by the server and valid only for the listing that returned them.

A web viewer over the same routes is served at `/ui` (it asks for a key and keeps it in the tab's
session storage).
"""


def create_app(settings: ApiSettings | None = None, *, store: Store | None = None) -> FastAPI:
    """Build the API over ``store`` (default: ``Store.open(settings.database_url)``)."""
    settings = settings or ApiSettings()
    if store is None:
        store = open_store(settings)
    docs = settings.api_docs
    timing_log = timing.TimingLog(settings.api_timing_dir) if settings.api_timing_dir else None

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        anyio.to_thread.current_default_thread_limiter().total_tokens = settings.api_threads
        await app.state.sapwood.versions.start()  # on the serving loop: it owns the listener
        gc_policy.apply(freeze=settings.api_gc_freeze, gen0_threshold=settings.api_gc_gen0_threshold)
        async with timing.monitor(timing_log):
            yield
        await app.state.sapwood.versions.close()
        app.state.sapwood.exports.close()

    app = FastAPI(
        lifespan=lifespan,
        title="Sapwood API",
        version="1",
        description=DESCRIPTION,
        docs_url="/docs" if docs else None,
        redoc_url=None,
        openapi_url="/openapi.json" if docs else None,
    )
    app.state.sapwood = Services(
        settings=settings,
        store=store,
        verifier=KeyVerifier(store.engine, ttl_s=settings.api_key_cache_s),
        cache=ResponseCache(settings.api_cache_bytes),
        tokenizer=load_tokenizer(settings.tokenizer),
        lag=LagReader(settings.kafka_bootstrap, timeout_s=settings.api_lag_timeout_s),
        versions=VersionReader(store.engine, statement_timeout_ms=settings.statement_timeout_ms,
                               max_idle=settings.api_db_pool_size, push=settings.api_version_push),
        paths=LRU(512),
        cursors=Cursors(settings.api_cursor_secret.get_secret_value() or None),
        exports=open_export_pool(settings, store),
        recorded_tokenizers=RecordedTokenizers() if settings.tokenizer.strip().lower() == "recorded" else None,
    )
    install_error_handlers(app)
    app.add_middleware(BodySizeLimitMiddleware, max_bytes=settings.api_max_body_bytes)
    app.add_middleware(KeyBeforeBodyMiddleware)  # outside the body limit: 401 before even a 413
    app.add_middleware(AllowHeaderMiddleware)
    app.add_middleware(RelativeRedirectMiddleware)
    app.add_middleware(HeaderLimitMiddleware, max_bytes=settings.api_max_header_bytes)
    if settings.api_cors_origins:  # outermost, so that every response (also a 413) carries the CORS headers
        app.add_middleware(CORSMiddleware, allow_origins=settings.api_cors_origins, allow_methods=["GET", "POST",
                           "DELETE"], allow_headers=["Authorization", "X-API-Key", "Content-Type"],
                           expose_headers=["ETag", "X-Sapwood-Verified"])
    if settings.api_timing or timing_log is not None:  # outermost: its app time is the whole request's
        timing.GC_CLOCK.install()
        timing.instrument_engine(store.engine)
        app.add_middleware(timing.TimingMiddleware, header=settings.api_timing, log=timing_log)
    for module in (health, stats, runs, prompts, executions, nodes, calls, export, keys, scheduler):
        app.include_router(module.router)
    mount_ui(app)
    _openapi_limits(app, settings)
    _prepare_routes(app)
    return app


def _prepare_routes(app: FastAPI) -> None:
    """Build every included route's matching state now, not on the worker's first request.

    FastAPI builds the state of an included router's routes (their dependency trees and pydantic
    fields, ~3 ms a route) the first time a request is matched against them: the first request of
    each worker paid for all 28 routes (65 ms on a loaded machine, 0.5 s in the profile of a cold
    benchmark start). Matching a placeholder request against each top-level route builds them.
    """
    scope = {"type": "http", "path": "/", "method": "GET", "headers": [], "query_string": b"", "root_path": "",
             "app": app}
    for route in app.router.routes:
        route.matches(dict(scope))


def _openapi_limits(app: FastAPI, settings: ApiSettings) -> None:
    """Make the schema's ``maximum`` of every size parameter the limit this server enforces (the
    ``Query`` declarations carry the settings' upper bounds, the settings may be lower)."""
    base = app.openapi

    def limit_for(path: str, name: str) -> int | None:
        if name == "max_nodes":
            return settings.api_tree_max_nodes
        if name != "limit":
            return None
        if path.startswith("/v1/nodes/{node_id}") and not path.endswith("/calls"):
            return settings.api_max_token_page
        if path == "/v1/export.parquet":
            return settings.api_max_export_executions
        return settings.api_max_page_size

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = base()
        for path, operations in schema.get("paths", {}).items():
            for operation in operations.values():
                for param in operation.get("parameters", ()):
                    maximum = limit_for(path, param.get("name", ""))
                    if maximum is None:
                        continue
                    target = param.get("schema", {})
                    for option in target.get("anyOf", [target]):  # Optional[int] is anyOf [int, null]
                        if option.get("type") == "integer":
                            option["maximum"] = min(maximum, option.get("maximum", maximum))
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
