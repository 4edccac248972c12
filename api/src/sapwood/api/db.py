"""The API's store: the platform's connection settings with a pool sized for a server's concurrency."""

from __future__ import annotations

from sapwood.api.config import ApiSettings
from sapwood.platform.storage.engines import make_engine
from sapwood.platform.store import Store


def open_store(settings: ApiSettings) -> Store:
    """Open the store for serving requests.

    The pool keeps ``api_db_pool_size`` connections (PostgreSQL; SQLite has none to keep): with
    SQLAlchemy's default (5 kept + 10 overflow, overflow closed on return) a worker answering more
    than 5 requests at once forks a new PostgreSQL backend per request, which dominated tail latency
    under load. A connection is pinged only after ``api_db_ping_idle_s`` idle in the pool (a busy
    worker's never are: one round trip fewer per request). The connection options are those of
    :func:`sapwood.platform.storage.engines.make_engine`.
    """
    engine = make_engine(settings.database_url, statement_timeout_ms=settings.statement_timeout_ms,
                         pool_size=settings.api_db_pool_size, max_overflow=settings.api_db_max_overflow,
                         pool_timeout=settings.api_db_pool_timeout_s, ping_idle_s=settings.api_db_ping_idle_s)
    store = Store(engine, cache_nodes=settings.context_cache_nodes)
    if settings.api_migrate:
        store.migrate()
    return store
