"""training runs, run items (claims), api keys

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30 20:26:29.130297
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('api_keys',
    sa.Column('key_id', sa.String(length=32), nullable=False, comment='public part of the key'),
    sa.Column('name', sa.String(length=128), nullable=False),
    sa.Column('secret_hash', sa.LargeBinary(length=32), nullable=False, comment='SHA-256 of the secret part'),
    sa.Column('scopes', sa.String(length=64), nullable=False, comment='space-separated: read write admin'),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.Column('revoked', sa.Boolean(), nullable=False),
    sa.PrimaryKeyConstraint('key_id', name=op.f('pk_api_keys'))
    )
    op.create_table('run_items',
    sa.Column('run_id', sa.String(length=128), nullable=False),
    sa.Column('execution_id', sa.Uuid(as_uuid=False), nullable=False),
    sa.Column('order_key', sa.BigInteger(), nullable=False),
    sa.Column('state', sa.String(length=8), nullable=False, comment='pending / claimed / done'),
    sa.Column('claimed_by', sa.String(length=128), nullable=True),
    sa.Column('lease_until', sa.Float(), nullable=True),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('done_at', sa.Float(), nullable=True),
    sa.PrimaryKeyConstraint('run_id', 'execution_id', name=op.f('pk_run_items'))
    )
    with op.batch_alter_table('run_items', schema=None) as batch_op:
        batch_op.create_index('ix_run_items_queue', ['run_id', 'state', 'order_key'], unique=False)

    op.create_table('runs',
    sa.Column('run_id', sa.String(length=128), nullable=False),
    sa.Column('kind', sa.String(length=16), nullable=False, comment='live (follows new executions) or replay (fixed history)'),
    sa.Column('filter', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=False, comment='ExecutionFilter selecting what the run consumes'),
    sa.Column('seed', sa.Integer(), nullable=False, comment='order of a replay run'),
    sa.Column('config', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=False),
    sa.Column('description', sa.String(), nullable=False),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('run_id', name=op.f('pk_runs'))
    )


def downgrade() -> None:
    op.drop_table('runs')
    with op.batch_alter_table('run_items', schema=None) as batch_op:
        batch_op.drop_index('ix_run_items_queue')

    op.drop_table('run_items')
    op.drop_table('api_keys')
