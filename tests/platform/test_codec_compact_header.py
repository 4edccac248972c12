"""The header leaves out scalar fields at their defaults and empty arrays (wire format §6: a field or
array left out takes its default); headers written with every field, as earlier releases did, still
decode to the same event with the same identity digest."""

from __future__ import annotations

import json
import struct

import numpy as np

from sapwood.platform.codec import decode, encode
from sapwood.platform.events import Event, ModelCall, Prompt
from sapwood.platform.replays import content_digest
from sapwood.platform.writer import ExecutionWriter


def _full_header_record(event: Event) -> bytes:
    """``event`` encoded the way earlier releases wrote it: every scalar field and every array listed."""
    arrays = event.array_fields()
    header = {"schema_version": event.schema_version, "kind": event.kind, "event_id": event.event_id,
              "execution_id": event.execution_id, "seq": event.seq, "created_at": event.created_at,
              "fields": event.scalar_fields(),
              "arrays": [[n, a.dtype.str, int(a.size)] for n, a in arrays.items()]}
    head = json.dumps(header, separators=(",", ":")).encode()
    return b"SPWD\x01\x00" + struct.pack("<I", len(head)) + head + b"".join(a.tobytes() for a in arrays.values())


def _header(record: bytes) -> dict[str, object]:
    (n,) = struct.unpack_from("<I", record, 6)
    return dict(json.loads(record[10 : 10 + n]))


def _calls() -> list[ModelCall]:
    w = ExecutionWriter(run_id="r", task_id="t")
    w.start()
    root = w.prompt(np.array([1, 2, 3], dtype=np.int32)).node_id
    lp = np.array([-0.5], dtype=np.float32)
    plain = w.call(root, np.array([4], dtype=np.int32), [5], lp)  # every optional field at its default
    odd = w.call(plain.output_node_id, np.zeros(0, dtype=np.int32), [6], lp, kind="summary",
                 policy_version=3, finish_reason="length", drift_checked=True, drift_at=0)
    return [plain, odd]


def test_defaults_and_empty_arrays_are_left_out() -> None:
    plain, odd = _calls()
    fields = _header(encode(plain))["fields"]
    assert fields == {"parent": plain.parent, "input_digest": plain.input_digest}
    odd_header = _header(encode(odd))
    assert odd_header["fields"] == {"call_kind": "summary", "parent": odd.parent, "input_digest": odd.input_digest,
                                    "policy_version": 3, "finish_reason": "length", "drift_checked": True,
                                    "drift_at": 0}, "0 is kept where the default is None; True where it is False"
    assert [a[0] for a in odd_header["arrays"]] == ["output_ids", "output_logprobs"], "empty appended left out"
    assert len(encode(plain)) < len(_full_header_record(plain))


def test_full_and_compact_headers_decode_to_the_same_event() -> None:
    for ev in [*_calls(), Prompt(execution_id="4f0e7a3c-5b1d-4c1e-9a57-0d3f8f1e2a10", seq=1,
                                 token_ids=np.array([9], dtype=np.int32))]:
        compact, full = decode(encode(ev)), decode(_full_header_record(ev))
        assert compact.scalar_fields() == full.scalar_fields() == ev.scalar_fields()
        for name, arr in ev.array_fields().items():
            np.testing.assert_array_equal(compact.array_fields()[name], arr)
            assert compact.array_fields()[name].dtype == full.array_fields()[name].dtype == arr.dtype
        assert content_digest(compact) == content_digest(full) == content_digest(ev), "identity unchanged"


def test_a_value_is_left_out_only_when_it_is_the_default_exactly() -> None:
    from sapwood.platform.events.base import _is_default

    assert _is_default(None, None)
    assert _is_default({}, {})
    assert _is_default("stop", "stop")
    assert not _is_default(0, False), "an int where the default is a bool would decode as a bool"
    assert not _is_default(0.0, 0), "a float where the default is an int would decode as an int"
    assert not _is_default(0, None)
    assert not _is_default(float("nan"), float("nan"))
