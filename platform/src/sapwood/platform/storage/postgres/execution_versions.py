"""Execution versions on PostgreSQL: migration 0003's notifications and the statements a listener runs.

The trigger ``executions_notify_version`` on ``executions`` sends
``pg_notify('sapwood_execution_versions', '<execution_id> <last_seq>')`` for every insert of an
execution and every update of its ``last_seq``. The statements use psycopg's ``%s`` parameters: the
API runs them on its own asyncio psycopg connections (``sapwood.api.versions``).
"""

from __future__ import annotations

from sqlalchemy.engine import Engine

#: The notification channel of migration 0003's trigger; payload ``"<execution_id> <last_seq>"``.
CHANNEL = "sapwood_execution_versions"
#: The trigger on ``executions`` that sends them.
TRIGGER = "executions_notify_version"
#: ``last_seq`` of one execution (parameter: its id as a UUID); no row when there is no such execution.
LAST_SEQ_SQL = "SELECT last_seq FROM executions WHERE execution_id = %s"
#: Whether the trigger (parameter: :data:`TRIGGER`) exists on ``executions``: one boolean.
HAS_TRIGGER_SQL = "SELECT EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = %s AND tgrelid = 'executions'::regclass)"


def native_async_postgres(engine: Engine) -> bool:
    """Whether ``engine`` is PostgreSQL through psycopg, so its URL opens asyncio psycopg connections that may
    run these statements and LISTEN on :data:`CHANNEL` (any other backend reads versions through the engine)."""
    return engine.dialect.name == "postgresql" and engine.dialect.driver == "psycopg"
