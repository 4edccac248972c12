"""calls.drift_checked and calls.drift_at: the retokenization drift check of each chat call

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-03 16:20:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('calls') as batch:
        batch.add_column(sa.Column('drift_checked', sa.Boolean(), server_default=sa.false(), nullable=False,
                                   comment="the input continued the previous chat call's context "
                                           "(retokenization drift checked)"))
        batch.add_column(sa.Column('drift_at', sa.Integer(), nullable=True,
                                   comment="index in the input of the first id differing from the previous "
                                           "call's output; null: none"))


def downgrade() -> None:
    with op.batch_alter_table('calls') as batch:
        batch.drop_column('drift_at')
        batch.drop_column('drift_checked')
