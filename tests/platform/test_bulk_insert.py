"""Bulk inserts (COPY text format on PostgreSQL) store awkward values exactly."""

from __future__ import annotations

import numpy as np
import sqlalchemy as sa

from sapwood.platform import schema as t
from sapwood.platform.bulkcopy import COPY_MIN_ROWS, bulk_insert, field_formatter
from sapwood.platform.store import Store

AWKWARD = ["", "tab\there", "line\nbreak\r\n", "back\\slash \\N \\.", "ünïcødé ✓", "quote \" ' ,"]


def test_awkward_values_round_trip(store: Store) -> None:
    rows = []
    for i in range(COPY_MIN_ROWS + 8):  # enough rows to take the COPY path on PostgreSQL
        text = AWKWARD[i % len(AWKWARD)]
        rows.append({"event_id": f"00000000-0000-4000-8000-{i:012d}", "execution_id": None, "seq": None,
                     "kind": text[:32] or "k", "schema_version": 1, "created_at": 1.0 / (i + 3),
                     "body": {"s": text, "n": [i, None, True, 2.5], "nested": {"k\t": text}}})
    rows[1]["seq"] = 7
    with store.transaction() as conn:
        bulk_insert(conn, t.events, rows)
    with store.transaction() as conn:
        got = conn.execute(sa.select(t.events.c.event_id, t.events.c.seq, t.events.c.kind, t.events.c.created_at,
                                     t.events.c.body).order_by(t.events.c.pos)).all()
    assert [(r.event_id, r.kind, r.created_at, r.body) for r in got] == [
        (r["event_id"], r["kind"], r["created_at"], r["body"]) for r in rows]
    assert got[1].seq == 7 and got[0].seq is None


def test_copy_field_formats() -> None:
    assert field_formatter(t.events.c.seq.type)(np.int64(7)) == "7"
    assert field_formatter(t.events.c.created_at.type)(np.float32(0.5)) == "0.5"
    assert field_formatter(t.nodes.c.is_leaf.type)(True) == "t"
    assert field_formatter(t.spans.c.digest.type)(b"\x01\xff") == r"\\x01ff"
    assert field_formatter(t.events.c.body.type)({"a": "x\ty"}) == r'{"a":"x\\ty"}'
    assert field_formatter(t.events.c.kind.type)("a\tb\\") == r"a\tb\\"
