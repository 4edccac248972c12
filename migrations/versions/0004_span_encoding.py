"""spans.encoding: token spans stored narrowed to the bits their largest id needs

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30 23:20:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None

_spans = sa.table("spans", sa.column("digest", sa.LargeBinary), sa.column("encoding", sa.SmallInteger),
                  sa.column("data", sa.LargeBinary))


def upgrade() -> None:
    # Existing rows hold canonical bytes: encoding 0.
    with op.batch_alter_table('spans', schema=None) as batch_op:
        batch_op.add_column(sa.Column('encoding', sa.SmallInteger(), server_default='0', nullable=False,
                                      comment='0 canonical bytes, 1 uint16 ids, 2 3-byte ids, 3 uint16 + high bits '
                                              '(see span_encoding)'))
    if op.get_bind().dialect.name == "postgresql":
        op.execute("COMMENT ON COLUMN spans.data IS 'the span''s bytes in its encoding'")
        op.execute("COMMENT ON COLUMN spans.digest IS 'BLAKE2b-128 of the canonical bytes'")


def downgrade() -> None:
    # Widen narrowed spans back to canonical bytes before the column goes.
    from sapwood.platform.span_encoding import ENC_RAW, decode_span

    conn = op.get_bind()
    while True:
        rows = conn.execute(sa.select(_spans.c.digest, _spans.c.encoding, _spans.c.data)
                            .where(_spans.c.encoding != ENC_RAW).limit(1000)).all()
        if not rows:
            break
        for digest, enc, data in rows:
            conn.execute(_spans.update().where(_spans.c.digest == digest)
                         .values(encoding=ENC_RAW, data=decode_span(enc, data)))
    with op.batch_alter_table('spans', schema=None) as batch_op:
        batch_op.drop_column('encoding')
    if conn.dialect.name == "postgresql":
        op.execute("COMMENT ON COLUMN spans.data IS 'packed little-endian int32 ids or float32 log-probs'")
        op.execute("COMMENT ON COLUMN spans.digest IS 'BLAKE2b-128 of data'")
