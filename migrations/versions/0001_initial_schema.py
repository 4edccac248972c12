"""initial schema: events, spans, tree projections, ingest offsets

Revision ID: 0001
Revises: 
Create Date: 2026-11-30 20:23:35.183005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('calls',
    sa.Column('call_id', sa.Uuid(as_uuid=False), nullable=False),
    sa.Column('execution_id', sa.Uuid(as_uuid=False), nullable=False),
    sa.Column('seq', sa.Integer(), nullable=False),
    sa.Column('call_kind', sa.String(length=8), nullable=False),
    sa.Column('segment', sa.Integer(), nullable=False),
    sa.Column('input_node', sa.Uuid(as_uuid=False), nullable=False, comment='last node of the input path'),
    sa.Column('input_len', sa.Integer(), nullable=False),
    sa.Column('input_digest', sa.String(length=32), nullable=False),
    sa.Column('output_node', sa.Uuid(as_uuid=False), nullable=False),
    sa.Column('n_output', sa.Integer(), nullable=False),
    sa.Column('logprobs_digest', sa.LargeBinary(length=16), nullable=False),
    sa.Column('policy_version', sa.Integer(), nullable=False),
    sa.Column('finish_reason', sa.String(length=32), nullable=False),
    sa.Column('timings', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=False),
    sa.Column('sampling_params', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=True),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('call_id', name=op.f('pk_calls'))
    )
    with op.batch_alter_table('calls', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_calls_execution_id'), ['execution_id'], unique=False)
        batch_op.create_index('ix_calls_input_node', ['input_node'], unique=False)

    op.create_table('consumer_offsets',
    sa.Column('group_id', sa.String(length=128), nullable=False),
    sa.Column('topic', sa.String(length=256), nullable=False),
    sa.Column('partition', sa.Integer(), nullable=False),
    sa.Column('next_offset', sa.BigInteger(), nullable=False),
    sa.Column('updated_at', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('group_id', 'topic', 'partition', name=op.f('pk_consumer_offsets'))
    )
    op.create_table('dead_letters',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('received_at', sa.Float(), nullable=False),
    sa.Column('reason', sa.String(length=32), nullable=False),
    sa.Column('message', sa.String(), nullable=False),
    sa.Column('event_id', sa.Uuid(as_uuid=False), nullable=True),
    sa.Column('execution_id', sa.Uuid(as_uuid=False), nullable=True),
    sa.Column('source', sa.String(length=256), nullable=False, comment='e.g. kafka:topic/partition@offset'),
    sa.Column('payload', sa.LargeBinary(), nullable=False, comment='the original bytes'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_dead_letters'))
    )
    op.create_table('events',
    sa.Column('pos', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False, comment='global append order'),
    sa.Column('event_id', sa.Uuid(as_uuid=False), nullable=False),
    sa.Column('execution_id', sa.Uuid(as_uuid=False), nullable=True),
    sa.Column('seq', sa.Integer(), nullable=True),
    sa.Column('kind', sa.String(length=32), nullable=False),
    sa.Column('schema_version', sa.SmallInteger(), nullable=False),
    sa.Column('created_at', sa.Float(), nullable=False, comment='producer clock, unix seconds'),
    sa.Column('body', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=False, comment='scalar fields; arrays as [span digest hex, count]'),
    sa.PrimaryKeyConstraint('pos', name=op.f('pk_events')),
    sa.UniqueConstraint('event_id', name=op.f('uq_events_event_id')),
    sa.UniqueConstraint('execution_id', 'seq', name='uq_events_execution_seq')
    )
    op.create_table('executions',
    sa.Column('execution_id', sa.Uuid(as_uuid=False), nullable=False),
    sa.Column('run_id', sa.String(length=128), nullable=False),
    sa.Column('task_id', sa.String(length=256), nullable=False),
    sa.Column('task_family', sa.String(length=64), nullable=False),
    sa.Column('engine', sa.String(length=128), nullable=False),
    sa.Column('sampling_params', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=False),
    sa.Column('vocab_size', sa.Integer(), nullable=True),
    sa.Column('metadata', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False, comment='running/success/timeout/error'),
    sa.Column('reward', sa.Float(), nullable=True),
    sa.Column('leaf_rewards', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=False),
    sa.Column('message', sa.String(), nullable=False),
    sa.Column('started_at', sa.Float(), nullable=False),
    sa.Column('finished_at', sa.Float(), nullable=True),
    sa.Column('last_seq', sa.Integer(), nullable=False),
    sa.Column('n_nodes', sa.Integer(), nullable=False),
    sa.Column('n_tokens', sa.BigInteger(), nullable=False, comment='tokens in the tree (shared prefixes once)'),
    sa.Column('n_input_tokens', sa.BigInteger(), nullable=False, comment='sum of call input lengths'),
    sa.Column('n_output_tokens', sa.BigInteger(), nullable=False),
    sa.Column('n_calls', sa.Integer(), nullable=False),
    sa.Column('n_forks', sa.Integer(), nullable=False),
    sa.Column('n_segments', sa.Integer(), nullable=False),
    sa.Column('max_policy_version', sa.Integer(), nullable=True),
    sa.Column('score', sa.Float(), nullable=True, comment='latest partial score'),
    sa.Column('score_revision', sa.Integer(), nullable=True),
    sa.PrimaryKeyConstraint('execution_id', name=op.f('pk_executions'))
    )
    with op.batch_alter_table('executions', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_executions_run_id'), ['run_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_executions_started_at'), ['started_at'], unique=False)
        batch_op.create_index(batch_op.f('ix_executions_status'), ['status'], unique=False)
        batch_op.create_index(batch_op.f('ix_executions_task_id'), ['task_id'], unique=False)

    op.create_table('nodes',
    sa.Column('node_id', sa.Uuid(as_uuid=False), nullable=False),
    sa.Column('execution_id', sa.Uuid(as_uuid=False), nullable=False),
    sa.Column('parent_id', sa.Uuid(as_uuid=False), nullable=True, comment='previous node of the same context'),
    sa.Column('prev_segment_node', sa.Uuid(as_uuid=False), nullable=True, comment='segment root: the summary it continues'),
    sa.Column('role', sa.SmallInteger(), nullable=False),
    sa.Column('span_digest', sa.LargeBinary(length=16), nullable=False),
    sa.Column('length', sa.Integer(), nullable=False, comment='tokens in this node'),
    sa.Column('depth', sa.Integer(), nullable=False, comment="token offset of the node's first token in its context"),
    sa.Column('segment', sa.Integer(), nullable=False),
    sa.Column('is_leaf', sa.Boolean(), nullable=False),
    sa.Column('fork_branches', sa.Integer(), nullable=False, comment='0 unless a fork event names this node'),
    sa.Column('call_id', sa.Uuid(as_uuid=False), nullable=True, comment='model call that produced this node'),
    sa.Column('policy_version', sa.Integer(), nullable=True),
    sa.Column('seq', sa.Integer(), nullable=False, comment='seq of the creating event'),
    sa.PrimaryKeyConstraint('node_id', name=op.f('pk_nodes'))
    )
    with op.batch_alter_table('nodes', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_nodes_execution_id'), ['execution_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_nodes_parent_id'), ['parent_id'], unique=False)

    op.create_table('policy_versions',
    sa.Column('run_id', sa.String(length=128), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('event_id', sa.Uuid(as_uuid=False), nullable=False),
    sa.Column('checkpoint', sa.String(), nullable=False),
    sa.Column('metadata', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=False),
    sa.Column('published_at', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('run_id', 'version', name=op.f('pk_policy_versions'))
    )
    op.create_table('scores',
    sa.Column('event_id', sa.Uuid(as_uuid=False), nullable=False),
    sa.Column('execution_id', sa.Uuid(as_uuid=False), nullable=False),
    sa.Column('revision', sa.Integer(), nullable=False),
    sa.Column('score', sa.Float(), nullable=False),
    sa.Column('components', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=False),
    sa.Column('scorer', sa.String(length=128), nullable=False),
    sa.Column('note', sa.String(), nullable=False),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('event_id', name=op.f('pk_scores')),
    sa.UniqueConstraint('execution_id', 'revision', name='uq_scores_execution_revision')
    )
    op.create_table('segments',
    sa.Column('root_node', sa.Uuid(as_uuid=False), nullable=False),
    sa.Column('execution_id', sa.Uuid(as_uuid=False), nullable=False),
    sa.Column('segment', sa.Integer(), nullable=False),
    sa.Column('from_node', sa.Uuid(as_uuid=False), nullable=False),
    sa.Column('seq', sa.Integer(), nullable=False),
    sa.PrimaryKeyConstraint('root_node', name=op.f('pk_segments'))
    )
    with op.batch_alter_table('segments', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_segments_execution_id'), ['execution_id'], unique=False)

    op.create_table('spans',
    sa.Column('digest', sa.LargeBinary(length=16), nullable=False, comment='BLAKE2b-128 of data'),
    sa.Column('data', sa.LargeBinary(), nullable=False, comment='packed little-endian int32 ids or float32 log-probs'),
    sa.PrimaryKeyConstraint('digest', name=op.f('pk_spans'))
    )


    if op.get_bind().dialect.name == "postgresql":
        # Token ids are incompressible for pglz: store span bytes out of line, uncompressed.
        op.execute("ALTER TABLE spans ALTER COLUMN data SET STORAGE EXTERNAL")


def downgrade() -> None:
    op.drop_table('spans')
    with op.batch_alter_table('segments', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_segments_execution_id'))

    op.drop_table('segments')
    op.drop_table('scores')
    op.drop_table('policy_versions')
    with op.batch_alter_table('nodes', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_nodes_parent_id'))
        batch_op.drop_index(batch_op.f('ix_nodes_execution_id'))

    op.drop_table('nodes')
    with op.batch_alter_table('executions', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_executions_task_id'))
        batch_op.drop_index(batch_op.f('ix_executions_status'))
        batch_op.drop_index(batch_op.f('ix_executions_started_at'))
        batch_op.drop_index(batch_op.f('ix_executions_run_id'))

    op.drop_table('executions')
    op.drop_table('events')
    op.drop_table('dead_letters')
    op.drop_table('consumer_offsets')
    with op.batch_alter_table('calls', schema=None) as batch_op:
        batch_op.drop_index('ix_calls_input_node')
        batch_op.drop_index(batch_op.f('ix_calls_execution_id'))

    op.drop_table('calls')
