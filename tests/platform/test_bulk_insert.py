"""Bulk inserts (COPY text format on PostgreSQL) store awkward values exactly."""

from __future__ import annotations

import struct

import numpy as np
import sqlalchemy as sa

from sapwood.platform import schema as t
from sapwood.platform.storage.postgres.bulkcopy import COPY_MIN_ROWS, frame_span, text_payload
from sapwood.platform.store import Store
from sapwood.platform.tokens import DIGEST_SIZE
from tests.support.bulk_insert import bulk_insert

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
    assert got[1].seq == 7
    assert got[0].seq is None


def test_copy_text_per_column_type() -> None:
    row = {"node_id": "6b1c8a5e-0000-4000-8000-000000000001", "parent_id": None, "role": np.int64(2),
           "span_digest": b"\x01\xff", "is_leaf": True, "policy_version": 3}
    sql, data = text_payload(t.nodes, [row])
    assert sql == 'COPY nodes ("node_id", "parent_id", "role", "span_digest", "is_leaf", "policy_version") FROM STDIN'
    assert data == b"6b1c8a5e-0000-4000-8000-000000000001\t\\N\t2\t\\\\x01ff\tt\t3\n"
    _, data = text_payload(t.events, [{"kind": "a\tb\\", "created_at": np.float32(0.5), "body": {"a": "x\ty"}}])
    assert data == b'a\\tb\\\\\t0.5\t{"a":"x\\\\ty"}\n'


def test_json_columns_take_numpy_scalars_int_keys_and_big_ints() -> None:
    _, data = text_payload(t.events, [{"body": {"k": np.int64(3), "f": np.float32(0.5), 1: "x"}}])
    assert data == b'{"k":3,"f":0.5,"1":"x"}\n'
    _, data = text_payload(t.events, [{"body": {"big": 2**70}}])  # beyond 64 bits: the standard library writes it
    assert data == b'{"big":1180591620717411303424}\n'


def _parse_span_row(data: bytes) -> tuple[int, bytes, int, bytes]:
    """(field count, digest, encoding, payload) of one binary-COPY ``spans`` row."""
    fields, n_digest = struct.unpack_from("!hi", data)
    digest = data[6 : 6 + n_digest]
    n_enc, encoding, n_data = struct.unpack_from("!ihi", data, 6 + n_digest)
    payload = data[6 + n_digest + 10 :]
    assert n_enc == 2
    assert len(payload) == n_data
    return fields, digest, encoding, payload


def test_span_rows_frame_any_digest_length() -> None:
    for digest in (bytes(range(DIGEST_SIZE)), b"\x01\x02\x03"):  # the one-pack path and the general one
        parts: list[bytes] = []
        size = frame_span(parts, digest, 3, b"payload bytes")
        row = b"".join(parts)
        assert size == len(row)
        assert _parse_span_row(row) == (3, digest, 3, b"payload bytes")
