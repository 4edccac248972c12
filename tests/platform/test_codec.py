import json
import struct

import numpy as np
import pytest

from sapwood.platform.codec import MAGIC, decode, encode
from sapwood.platform.errors import DecodeError, DTypeError, LengthMismatchError, SchemaVersionError
from sapwood.platform.events import ModelCall
from tests.support.histories import small_execution


def _same(a, b) -> None:
    assert type(a) is type(b)
    assert a.event_id == b.event_id
    assert a.seq == b.seq
    assert a.execution_id == b.execution_id
    assert a.scalar_fields() == b.scalar_fields()
    for name, arr in a.array_fields().items():
        other = b.array_fields()[name]
        assert arr.dtype == other.dtype
        np.testing.assert_array_equal(arr, other)


@pytest.mark.parametrize("compress", [False, True])
def test_every_event_kind_round_trips(compress: bool) -> None:
    w = small_execution(1, status="timeout")
    kinds = {e.kind for e in w.events}
    assert {"execution_started", "prompt", "model_call", "observation", "fork", "segment_boundary",
            "partial_score", "execution_finished"} <= kinds
    for ev in w.events:
        _same(ev, decode(encode(ev, compress=compress)))


def test_tokens_travel_packed_not_as_json_numbers() -> None:
    call = next(e for e in small_execution(2).events if isinstance(e, ModelCall))
    data = encode(call)
    (head_len,) = struct.unpack_from("<I", data, 6)
    header = json.loads(data[10 : 10 + head_len])
    assert "output_ids" not in header["fields"]
    assert ["output_ids", "<i4", int(call.output_ids.size)] in header["arrays"]
    assert ["output_logprobs", "<f4", int(call.output_logprobs.size)] in header["arrays"]
    assert len(data) - 10 - head_len == 4 * (call.appended.size + 2 * call.output_ids.size)


def test_zstd_shrinks_repetitive_payloads() -> None:
    call = next(e for e in small_execution(3).events if isinstance(e, ModelCall))
    call.appended = np.zeros(5000, dtype=np.int32)
    assert len(encode(call, compress=True)) < len(encode(call)) / 5


def test_garbage_and_truncation_are_decode_errors() -> None:
    with pytest.raises(DecodeError, match="not a Sapwood event"):
        decode(b"\x00garbage bytes here")
    good = encode(small_execution(4).events[3])
    with pytest.raises(DecodeError):
        decode(good[:-3])
    with pytest.raises(DecodeError, match="too short"):
        decode(MAGIC)


def _rewrite_header(data: bytes, mutate) -> bytes:
    (head_len,) = struct.unpack_from("<I", data, 6)
    header = json.loads(data[10 : 10 + head_len])
    mutate(header)
    head = json.dumps(header).encode()
    return data[:6] + struct.pack("<I", len(head)) + head + data[10 + head_len :]


def test_unknown_schema_version_says_what_is_supported() -> None:
    data = encode(small_execution(5).events[0])
    bad = _rewrite_header(data, lambda h: h.update(schema_version=99))
    with pytest.raises(SchemaVersionError, match=r"unknown schema version 99.*expected one of \[1\]"):
        decode(bad)


def test_wrong_dtype_is_rejected() -> None:
    call = next(e for e in small_execution(6).events if isinstance(e, ModelCall))

    def to_f4(h: dict) -> None:
        for entry in h["arrays"]:
            if entry[0] == "output_ids":
                entry[1] = "<f4"

    with pytest.raises(DTypeError, match=r"output_ids: wrong dtype '<f4', expected '<i4'"):
        decode(_rewrite_header(encode(call), to_f4))


def test_length_mismatch_detected_on_decode() -> None:
    call = next(e for e in small_execution(7).events if isinstance(e, ModelCall))
    call.output_logprobs = call.output_logprobs[:-1]
    with pytest.raises(LengthMismatchError, match="expected one rollout log-prob per output token"):
        decode(encode(call))


@pytest.mark.parametrize("dtype", ["not-a-dtype", 7, None, "<i8"])
def test_unreadable_or_other_dtypes_are_rejected(dtype: object) -> None:
    call = next(e for e in small_execution(8).events if isinstance(e, ModelCall))

    def retype(h: dict) -> None:
        h["arrays"][0][1] = dtype

    with pytest.raises(DTypeError, match="wrong dtype"):
        decode(_rewrite_header(encode(call), retype))


def test_header_json_beyond_strict_rfc_still_decodes_and_then_fails_validation() -> None:
    """A NaN reward or a 70-bit int (what the encoder's JSON can write) reaches validation, which names it."""
    from sapwood.platform.errors import ValidationError

    finished = small_execution(9).events[-1]
    finished.reward = float("nan")
    event = decode(encode(finished), validate=False)
    assert event.reward != event.reward  # type: ignore[attr-defined]
    with pytest.raises(ValidationError, match="rewards must be finite"):
        decode(encode(finished))
    score = next(e for e in small_execution(10, status="timeout").events if e.kind == "partial_score")
    score.components = {"big": 2**70}  # type: ignore[attr-defined]
    assert decode(encode(score)).components == {"big": 2**70}  # type: ignore[attr-defined]


def test_memoryview_and_bytearray_inputs_decode() -> None:
    call = next(e for e in small_execution(11).events if isinstance(e, ModelCall))
    data = encode(call)
    _same(call, decode(memoryview(data)))
    _same(call, decode(bytearray(data)))
