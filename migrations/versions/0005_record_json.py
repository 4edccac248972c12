"""events.body, calls.timings and calls.sampling_params as json text on PostgreSQL

They are documents kept as recorded and only ever read whole, so JSONB's parse into its binary
form on every insert is wasted work on the ingest path (about a third of the events COPY).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 03:10:00
"""

from __future__ import annotations

from alembic import op

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None

_COLUMNS = (("events", "body"), ("calls", "timings"), ("calls", "sampling_params"))


def upgrade() -> None:
    _retype("json")


def downgrade() -> None:
    _retype("jsonb")


def _retype(sql_type: str) -> None:
    # SQLite stores JSON as text either way: nothing to do there.
    if op.get_bind().dialect.name != "postgresql":
        return
    for table, column in _COLUMNS:
        op.execute(f'ALTER TABLE {table} ALTER COLUMN "{column}" TYPE {sql_type} USING "{column}"::{sql_type}')
