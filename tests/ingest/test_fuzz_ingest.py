"""Property-based fuzzing of the record decoder and the event validator (CI profile: fixed example
counts, no deadline flakiness): every input is one event or one dead letter with a known reason, no
exception escapes or comes from the decoder's catch-all, and memory and time per record stay bounded
(``tests/support/ingest_fuzz.py`` states the bounds)."""

from __future__ import annotations

import json
import struct

import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sapwood.platform.codec import decode, encode
from tests.support.histories import small_execution
from tests.support.ingest_fuzz import check_record

CI = settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
SEEDS = [bytes(v) for v in (encode(e, compress=c) for c in (False, True) for e in small_execution(7).events)]
_MAGIC = b"SPWD\x01"


def _record(header: object, arrays: bytes = b"", flags: int = 0) -> bytes:
    head = json.dumps(header).encode() if not isinstance(header, bytes) else header
    payload = struct.pack("<I", len(head)) + head + arrays
    if flags & 1:
        payload = zstandard.ZstdCompressor().compress(payload)
    return _MAGIC + bytes([flags]) + payload


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                      max_size=4), max_leaves=12)


@CI
@given(st.binary(max_size=2048))
def test_arbitrary_bytes(value: bytes) -> None:
    check_record(value)


@CI
@given(st.sampled_from(SEEDS), st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=8),
       st.integers(0, 10_000))
def test_valid_records_with_flipped_bytes_and_truncation(seed: bytes, flips: list[tuple[int, int]], cut: int) -> None:
    value = bytearray(seed)
    for at, byte in flips:
        value[at % len(value)] = byte
    check_record(bytes(value[: max(0, len(value) - cut % 64)]))


@CI
@given(st.sampled_from(SEEDS), st.sampled_from(["kind", "event_id", "execution_id", "seq", "created_at",
                                                "schema_version", "fields", "arrays"]), json_values)
def test_valid_headers_with_one_key_replaced_by_any_json(seed: bytes, key: str, replacement: object) -> None:
    event = decode(seed)
    raw = seed if seed[5] == 0 else _MAGIC + b"\x00" + zstandard.ZstdDecompressor().decompress(seed[6:])
    size = struct.unpack_from("<I", raw, 6)[0]
    header = json.loads(raw[10 : 10 + size])
    header[key] = replacement
    check_record(_record(header, raw[10 + size :]))
    assert event.kind in {"execution_started", "prompt", "model_call", "observation", "fork", "segment_boundary",
                          "execution_finished", "partial_score"}


@CI
@given(st.dictionaries(st.text(max_size=12), json_values, max_size=6), st.binary(max_size=256),
       st.sampled_from([0, 1, 2, 0x81]))
def test_arbitrary_headers_and_flags(header: dict[str, object], arrays: bytes, flags: int) -> None:
    check_record(_record(header, arrays, flags & 1) if flags != 0x81 else _MAGIC + bytes([flags]) + arrays)


@settings(max_examples=20, deadline=None, derandomize=True)
@given(st.integers(0, 4 << 20), st.booleans(), st.integers(1, 4))
def test_zstd_bombs_stay_under_the_memory_bound(size: int, declare: bool, frames: int) -> None:
    body = _record({"kind": "prompt"}, bytes(size))[6:]
    cctx = zstandard.ZstdCompressor(write_content_size=declare)
    step = max(1, len(body) // frames)
    value = _MAGIC + b"\x01" + b"".join(cctx.compress(body[i : i + step]) for i in range(0, len(body), step))
    outcome = check_record(value)
    assert outcome.result == ("too_large" if size > 64 * 1024 else outcome.result)


def _seed_header() -> tuple[dict[str, object], bytes]:
    raw = SEEDS[1]
    size = struct.unpack_from("<I", raw, 6)[0]
    return json.loads(raw[10 : 10 + size]), raw[10 + size :]


def test_the_fuzz_findings_are_clear_dead_letters() -> None:
    """Found by this campaign: a list or object as `kind` or `schema_version`, `arrays` not a list, or an
    array name that is not a string raised TypeError inside the codec (dead-lettered only by the
    decoder's catch-all, with a message naming no field)."""
    for key, value, reason in [("kind", [1], "decode"), ("schema_version", {"a": 1}, "schema_version"),
                               ("arrays", 1.5, "decode"), ("arrays", [[[1], "<i4", 1]], "decode")]:
        header, arrays = _seed_header()
        header[key] = value
        assert check_record(_record(header, arrays)).result == reason, key
