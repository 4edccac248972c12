"""notify execution versions: pg_notify('sapwood_execution_versions', '<execution_id> <last_seq>')

Every insert of an execution and every update that changes its ``last_seq`` (COPY fires row
triggers too) sends one notification, delivered when the writing transaction commits. The API
workers listen on the channel and keep each execution's version in memory, so that a cached tree
is validated without a query (sapwood.api.versions). PostgreSQL only; a no-op elsewhere.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02 23:00:00.000000
"""

from __future__ import annotations

from alembic import op

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None

CHANNEL = "sapwood_execution_versions"  # sapwood.platform.storage.postgres.execution_versions.CHANNEL


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(f"""
        CREATE FUNCTION sapwood_notify_execution_version() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF TG_OP = 'UPDATE' AND NEW.last_seq = OLD.last_seq THEN
                RETURN NULL;
            END IF;
            PERFORM pg_notify('{CHANNEL}', NEW.execution_id::text || ' ' || NEW.last_seq);
            RETURN NULL;
        END
        $$
    """)
    op.execute("""
        CREATE TRIGGER executions_notify_version
        AFTER INSERT OR UPDATE OF last_seq ON executions
        FOR EACH ROW EXECUTE FUNCTION sapwood_notify_execution_version()
    """)


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("DROP TRIGGER IF EXISTS executions_notify_version ON executions")
    op.execute("DROP FUNCTION IF EXISTS sapwood_notify_execution_version()")
