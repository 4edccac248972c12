"""events.content_digest (conflicting replays are told apart from duplicates); dead_letters.record_key

``content_digest`` is BLAKE2b-128 of an event's canonical content (see ``apply.content_digest``):
a replayed event id whose digest differs is a ``conflict`` dead letter, an equal one a duplicate.
Rows stored before this revision keep NULL and are compared by kind, execution and seq only.
``record_key`` keeps the Kafka record key (the execution id) of a dead letter, so a record that
could not even be decoded still names its execution.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 21:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('events', schema=None) as batch_op:
        batch_op.add_column(sa.Column('content_digest', sa.LargeBinary(16), nullable=True,
                                      comment='BLAKE2b-128 of the canonical content (NULL before revision 0008)'))
    with op.batch_alter_table('dead_letters', schema=None) as batch_op:
        batch_op.add_column(sa.Column('record_key', sa.LargeBinary(), nullable=True,
                                      comment='Kafka record key (the execution id for TITO events)'))


def downgrade() -> None:
    with op.batch_alter_table('dead_letters', schema=None) as batch_op:
        batch_op.drop_column('record_key')
    with op.batch_alter_table('events', schema=None) as batch_op:
        batch_op.drop_column('content_digest')
