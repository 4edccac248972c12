"""spans: keep rows up to a page (8160 bytes) inline instead of moving them to TOAST

Narrowed spans of a typical observation or action are 2–8 KB. Above the default threshold
(~2 KB) PostgreSQL moves each one to the TOAST table in ~2 KB chunks, one TOAST index entry per
chunk: about a fifth of the time a batch's spans take to store. ``data`` is already
``STORAGE EXTERNAL`` (no compression attempt), so raising the threshold changes only where the
bytes live; rows larger than a page are still TOASTed.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01 05:20:00
"""

from __future__ import annotations

from alembic import op

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A PostgreSQL storage parameter; SQLite has no TOAST.
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE spans SET (toast_tuple_target = 8160)")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE spans RESET (toast_tuple_target)")
