"""prompt queue: prompts, prompt_samples (leased like run_items), prompt_attempts (abandoned executions)

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02 11:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql')


def upgrade() -> None:
    op.create_table('prompts',
    sa.Column('run_id', sa.String(length=128), nullable=False),
    sa.Column('prompt_index', sa.Integer(), nullable=False, comment='row of the dataset the prompt came from'),
    sa.Column('prompt', _JSON, nullable=False, comment='text, or a list of chat messages {role, content}'),
    sa.Column('task_id', sa.String(length=256), nullable=False),
    sa.Column('task_family', sa.String(length=128), nullable=False),
    sa.Column('metadata', _JSON, nullable=False),
    sa.PrimaryKeyConstraint('run_id', 'prompt_index', name=op.f('pk_prompts'))
    )
    op.create_table('prompt_samples',
    sa.Column('run_id', sa.String(length=128), nullable=False),
    sa.Column('sample_id', sa.String(length=64), nullable=False, comment="'{prompt_index}:{epoch}:{sample}'"),
    sa.Column('prompt_index', sa.Integer(), nullable=False),
    sa.Column('epoch', sa.Integer(), nullable=False),
    sa.Column('order_key', sa.BigInteger(), nullable=False),
    sa.Column('state', sa.String(length=8), nullable=False, comment='pending / claimed / done'),
    sa.Column('claimed_by', sa.String(length=128), nullable=True),
    sa.Column('lease_until', sa.Float(), nullable=True),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('done_at', sa.Float(), nullable=True),
    sa.Column('execution_id', sa.Uuid(as_uuid=False), nullable=True, comment='the execution of the current attempt'),
    sa.PrimaryKeyConstraint('run_id', 'sample_id', name=op.f('pk_prompt_samples'))
    )
    with op.batch_alter_table('prompt_samples', schema=None) as batch_op:
        batch_op.create_index('ix_prompt_samples_queue', ['run_id', 'state', 'order_key'], unique=False)
    op.create_table('prompt_attempts',
    sa.Column('execution_id', sa.Uuid(as_uuid=False), nullable=False),
    sa.Column('run_id', sa.String(length=128), nullable=False),
    sa.Column('sample_id', sa.String(length=64), nullable=False),
    sa.Column('worker', sa.String(length=128), nullable=False),
    sa.Column('started_at', sa.Float(), nullable=False),
    sa.Column('state', sa.String(length=9), nullable=False,
              comment='recording / finished / abandoned (never trained)'),
    sa.PrimaryKeyConstraint('execution_id', name=op.f('pk_prompt_attempts'))
    )
    with op.batch_alter_table('prompt_attempts', schema=None) as batch_op:
        batch_op.create_index('ix_prompt_attempts_sample', ['run_id', 'sample_id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('prompt_attempts', schema=None) as batch_op:
        batch_op.drop_index('ix_prompt_attempts_sample')
    op.drop_table('prompt_attempts')
    with op.batch_alter_table('prompt_samples', schema=None) as batch_op:
        batch_op.drop_index('ix_prompt_samples_queue')
    op.drop_table('prompt_samples')
    op.drop_table('prompts')
