"""idempotency keys: the stored answer of each POST sent with an Idempotency-Key header

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-03 11:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('idempotency_keys',
    sa.Column('principal', sa.String(length=32), nullable=False, comment='key_id of the API key that sent the request'),
    sa.Column('idempotency_key', sa.String(length=128), nullable=False, comment='the Idempotency-Key header'),
    sa.Column('route', sa.String(length=300), nullable=False, comment='method and path of the first request'),
    sa.Column('request_digest', sa.LargeBinary(length=32), nullable=False,
              comment='SHA-256 of method, path and the canonical JSON of the validated body'),
    sa.Column('status', sa.Integer(), nullable=False, comment='HTTP status of the stored answer'),
    sa.Column('body', sa.LargeBinary(), nullable=False, comment='JSON body of the stored answer'),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('principal', 'idempotency_key', name=op.f('pk_idempotency_keys'))
    )


def downgrade() -> None:
    op.drop_table('idempotency_keys')
