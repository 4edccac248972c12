"""The FastAPI application factory (``uvicorn sapwood.api.main:create_app --factory``)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from sapwood.api.auth import KeyVerifier
from sapwood.api.cache import LRU, ResponseCache
from sapwood.api.config import ApiSettings
from sapwood.api.db import open_store
from sapwood.api.deps import Services
from sapwood.api.errors import install_error_handlers
from sapwood.api.middleware import BodySizeLimitMiddleware
from sapwood.api.queries.stats import LagReader
from sapwood.api.routes import calls, executions, export, health, keys, nodes, runs, scheduler, stats
from sapwood.api.tokenizer import load_tokenizer
from sapwood.api.versions import VersionReader
from sapwood.platform.store import Store

DESCRIPTION = """\
Queries over Sapwood's trajectory trees, exact-context audits of model calls, replay of historical
rollouts into new training runs, and Parquet export.

Every `/v1` route needs an API key (`sapwood keys create --name NAME --scopes "read write"`), sent as
`Authorization: Bearer <key_id>.<secret>` or `X-API-Key: <key_id>.<secret>`. Scopes: `read` for
queries, `write` for new runs and score revisions, `admin` for key management. Errors are
`{"error": {"code": ..., "message": ...}}`.
"""


def create_app(settings: ApiSettings | None = None, *, store: Store | None = None) -> FastAPI:
    """Build the API over ``store`` (default: ``Store.open(settings.database_url)``)."""
    settings = settings or ApiSettings()
    if store is None:
        store = open_store(settings)
    docs = settings.api_docs

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await app.state.sapwood.versions.start()  # on the serving loop: it owns the listener
        yield
        await app.state.sapwood.versions.close()

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
    )
    install_error_handlers(app)
    app.add_middleware(BodySizeLimitMiddleware, max_bytes=settings.api_max_body_bytes)
    if settings.api_cors_origins:  # outermost, so that every response (also a 413) carries the CORS headers
        app.add_middleware(CORSMiddleware, allow_origins=settings.api_cors_origins, allow_methods=["GET", "POST",
                           "DELETE"], allow_headers=["Authorization", "X-API-Key", "Content-Type"],
                           expose_headers=["ETag", "X-Sapwood-Verified"])
    for module in (health, stats, runs, executions, nodes, calls, export, keys, scheduler):
        app.include_router(module.router)
    return app
