"""cells, scheduler decisions and switch phases (projections of the scheduler's cell events)

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01 20:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql')


def upgrade() -> None:
    op.create_table('cells',
    sa.Column('cell_id', sa.String(length=128), nullable=False),
    sa.Column('tier', sa.String(length=16), nullable=False, comment='core (holds parameters) or satellite'),
    sa.Column('capacity', sa.Integer(), nullable=False, comment='concurrent rollouts in the rollout role'),
    sa.Column('role', sa.String(length=16), nullable=False, comment='rollout / train / idle (the last role assigned)'),
    sa.Column('role_since', sa.Float(), nullable=False),
    sa.Column('registered_at', sa.Float(), nullable=False),
    sa.Column('last_heartbeat_at', sa.Float(), nullable=False),
    sa.Column('heartbeats', sa.BigInteger(), nullable=False),
    sa.Column('role_changes', sa.Integer(), nullable=False),
    sa.Column('switch_s', sa.Float(), nullable=False, comment='sum of switch phase durations'),
    sa.Column('last_phase', sa.String(length=64), nullable=True),
    sa.Column('metadata', _JSON, nullable=False),
    sa.PrimaryKeyConstraint('cell_id', name=op.f('pk_cells'))
    )
    op.create_table('scheduler_decisions',
    sa.Column('event_id', sa.Uuid(as_uuid=False), nullable=False),
    sa.Column('cell_id', sa.String(length=128), nullable=False),
    sa.Column('role', sa.String(length=16), nullable=False),
    sa.Column('previous_role', sa.String(length=16), nullable=False),
    sa.Column('reason', sa.String(), nullable=False),
    sa.Column('policy', sa.String(length=256), nullable=False),
    sa.Column('signals', _JSON, nullable=False, comment='the signal snapshot the decision was made on'),
    sa.Column('decided_at', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('event_id', name=op.f('pk_scheduler_decisions'))
    )
    with op.batch_alter_table('scheduler_decisions', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_scheduler_decisions_cell_id'), ['cell_id'], unique=False)
        batch_op.create_index('ix_scheduler_decisions_time', ['decided_at', 'event_id'], unique=False)
    op.create_table('switch_phases',
    sa.Column('event_id', sa.Uuid(as_uuid=False), nullable=False),
    sa.Column('cell_id', sa.String(length=128), nullable=False),
    sa.Column('role', sa.String(length=16), nullable=False),
    sa.Column('phase', sa.String(length=64), nullable=False),
    sa.Column('duration_s', sa.Float(), nullable=False),
    sa.Column('at', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('event_id', name=op.f('pk_switch_phases'))
    )
    with op.batch_alter_table('switch_phases', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_switch_phases_cell_id'), ['cell_id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('switch_phases', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_switch_phases_cell_id'))
    op.drop_table('switch_phases')
    with op.batch_alter_table('scheduler_decisions', schema=None) as batch_op:
        batch_op.drop_index('ix_scheduler_decisions_time')
        batch_op.drop_index(batch_op.f('ix_scheduler_decisions_cell_id'))
    op.drop_table('scheduler_decisions')
    op.drop_table('cells')
