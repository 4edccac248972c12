"""Which implementation of each storage interface serves a connection's dialect: the factories, in one place.

Each interface (a protocol, with what its implementations share) lives in its own module; the SQLite and
PostgreSQL implementations under :mod:`.sqlite` and :mod:`.postgres` import it; only this module imports
the implementations, so no interface module depends on a dialect's.

- :func:`event_applier` — :class:`~.applier.EventApplier` (what :func:`sapwood.platform.apply.apply_events`
  writes through);
- :func:`tree_reader` — :class:`~.trees.TreeReader`;
- :func:`run_queue` — :class:`~.runs.RunQueue`;
- :func:`prompt_queue` — :class:`~.prompts_sql.PromptQueue` (over the dialect's run queue);
- :func:`offset_store` — :class:`~.offsets.OffsetStore`;
- :func:`api_key_store` — :class:`~.api_keys.ApiKeyStore`;
- :func:`transactions` — :class:`~.transactions.Transactions`;
- :func:`version_channel` — :class:`~.versions.VersionChannel` (None where the backend cannot push).

Stateless implementations are built once per dialect (their statements are compiled once).
"""

from __future__ import annotations

import functools

from sqlalchemy.engine import Connection, Engine

from sapwood.platform.storage.api_keys import ApiKeyStore
from sapwood.platform.storage.applier import EventApplier
from sapwood.platform.storage.dialects import dialect_name, for_dialect
from sapwood.platform.storage.offsets import OffsetStore
from sapwood.platform.storage.postgres.api_keys import PostgresApiKeyStore
from sapwood.platform.storage.postgres.applier import PostgresApplier
from sapwood.platform.storage.postgres.execution_versions import native_async_postgres
from sapwood.platform.storage.postgres.offsets import PostgresOffsetStore
from sapwood.platform.storage.postgres.runs import PostgresRunQueue
from sapwood.platform.storage.postgres.transactions import PostgresTransactions
from sapwood.platform.storage.postgres.trees import PostgresTreeReader
from sapwood.platform.storage.postgres.version_channel import PostgresVersionChannel
from sapwood.platform.storage.prompts_sql import PromptQueue
from sapwood.platform.storage.runs import RunQueue
from sapwood.platform.storage.runs_sql import SqlRunQueue
from sapwood.platform.storage.sqlite.api_keys import SQLiteApiKeyStore
from sapwood.platform.storage.sqlite.applier import SqliteApplier
from sapwood.platform.storage.sqlite.offsets import SqliteOffsetStore
from sapwood.platform.storage.sqlite.runs import SQLiteRunQueue
from sapwood.platform.storage.sqlite.transactions import SQLiteTransactions
from sapwood.platform.storage.sqlite.trees import SQLiteTreeReader
from sapwood.platform.storage.transactions import Transactions
from sapwood.platform.storage.trees import TreeReader
from sapwood.platform.storage.versions import VersionChannel

Dialect = str | Engine | Connection
"""``"sqlite"``, ``"postgresql"``, or an engine / connection of one."""


def event_applier(conn: Connection) -> EventApplier:
    """The event applier of ``conn``'s dialect (one per batch: it holds the batch's span stream)."""
    trees = tree_reader(conn)
    return for_dialect(conn, "event applier", sqlite=lambda: SqliteApplier(conn, trees),
                       postgresql=lambda: PostgresApplier(conn, trees))


def tree_reader(dialect: Dialect) -> TreeReader:
    """The tree reader for ``dialect``."""
    return _tree_reader(dialect_name(dialect))


def run_queue(dialect: Dialect) -> RunQueue:
    """The run queue for ``dialect`` (claims ask for it on every batch)."""
    return _run_queue(dialect_name(dialect))


def prompt_queue(dialect: Dialect) -> PromptQueue:
    """The prompt queue for ``dialect`` (its leases use the dialect's run-queue row locks)."""
    return _prompt_queue(dialect_name(dialect))


def offset_store(dialect: Dialect) -> OffsetStore:
    """The offset store for ``dialect`` (ingest asks for it on every batch)."""
    return _offset_store(dialect_name(dialect))


def api_key_store(dialect: Dialect) -> ApiKeyStore:
    """The API key store for ``dialect``."""
    return for_dialect(dialect, "API key store", sqlite=SQLiteApiKeyStore, postgresql=PostgresApiKeyStore)


def transactions(dialect: Dialect) -> Transactions:
    """The transaction modes of ``dialect``."""
    return for_dialect(dialect, "transaction modes", sqlite=SQLiteTransactions, postgresql=PostgresTransactions)


def version_channel(engine: Engine, *, statement_timeout_ms: int, max_idle: int = 8,
                    heartbeat_s: float = 5.0) -> VersionChannel | None:
    """Pushed execution versions where ``engine``'s backend has them (PostgreSQL via psycopg), else None."""
    if not native_async_postgres(engine):
        return None
    return PostgresVersionChannel(engine, statement_timeout_ms=statement_timeout_ms, max_idle=max_idle,
                                  heartbeat_s=heartbeat_s)


@functools.cache
def _tree_reader(name: str) -> TreeReader:
    return for_dialect(name, "tree reader", sqlite=SQLiteTreeReader, postgresql=PostgresTreeReader)


@functools.cache
def _run_queue(name: str) -> RunQueue:
    return for_dialect(name, "run queue", sqlite=SQLiteRunQueue, postgresql=PostgresRunQueue)


@functools.cache
def _prompt_queue(name: str) -> PromptQueue:
    runs = _run_queue(name)
    assert isinstance(runs, SqlRunQueue)
    return PromptQueue(runs)


@functools.cache
def _offset_store(name: str) -> OffsetStore:
    return for_dialect(name, "offset store", sqlite=SqliteOffsetStore, postgresql=PostgresOffsetStore)


__all__ = ["Dialect", "api_key_store", "event_applier", "offset_store", "prompt_queue", "run_queue", "transactions",
           "tree_reader", "version_channel"]
