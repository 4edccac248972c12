"""Span encodings: narrowed token ids decode to exactly the canonical bytes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sapwood.platform.errors import StoreError
from sapwood.platform.span_encoding import ENC_RAW, ENC_U16, ENC_U16_HIGH_BITS, ENC_U24, decode_span, encode_span
from sapwood.platform.tokens import LOGPROB_DTYPE, TOKEN_DTYPE


@pytest.mark.parametrize(("high", "encoding", "size"), [
    (65_535, ENC_U16, 2 * 8),
    (65_536, ENC_U16_HIGH_BITS, 5 + 2 * 8 + 1),  # 1 high bit per id
    (151_935, ENC_U16_HIGH_BITS, 5 + 2 * 8 + 2),  # 2 high bits: a 151,936-token vocabulary
    ((1 << 23) - 1, ENC_U16_HIGH_BITS, 5 + 2 * 8 + 7),
    (1 << 23, ENC_U24, 3 * 8), ((1 << 24) - 1, ENC_U24, 3 * 8),
    (1 << 24, ENC_RAW, 4 * 8), (2**31 - 1, ENC_RAW, 4 * 8),
])
def test_narrowest_form_that_holds_the_largest_id(high: int, encoding: int, size: int) -> None:
    ids = np.array([0, 7, high, 3, 65_535, 65_536 % (high + 1), 1, high // 2], dtype=TOKEN_DTYPE)
    enc, data = encode_span(ids)
    assert (enc, len(data)) == (encoding, size)
    assert decode_span(enc, data) == ids.tobytes()


def test_large_vocabulary_costs_2_25_bytes_per_token() -> None:
    ids = np.random.default_rng(0).integers(0, 151_936, 10_000, dtype=np.int32)
    enc, data = encode_span(ids)
    assert enc == ENC_U16_HIGH_BITS
    assert len(data) == 5 + 22_500
    assert decode_span(enc, memoryview(data)) == ids.tobytes()


def test_logprobs_and_negative_ids_stay_canonical() -> None:
    lps = np.array([-0.5, -1e-7, 0.0], dtype=LOGPROB_DTYPE)
    assert encode_span(lps) == (ENC_RAW, lps.tobytes())
    neg = np.array([-1, 5], dtype=TOKEN_DTYPE)  # not valid token ids, but never silently corrupted
    assert encode_span(neg) == (ENC_RAW, neg.tobytes())


def test_strided_views_encode_like_copies() -> None:
    ids = np.arange(100_000, 100_040, dtype=TOKEN_DTYPE)[::3]
    enc, data = encode_span(ids)
    assert decode_span(enc, data) == np.ascontiguousarray(ids).tobytes()


def test_corrupt_or_unknown_encodings_raise() -> None:
    with pytest.raises(StoreError, match="multiple of 3"):
        decode_span(ENC_U24, b"\x01\x02\x03\x04")
    with pytest.raises(StoreError, match="unknown span encoding 9"):
        decode_span(9, b"")
    _, data = encode_span(np.array([70_000, 1], dtype=TOKEN_DTYPE))
    with pytest.raises(StoreError, match="header says 2 ids"):
        decode_span(ENC_U16_HIGH_BITS, data[:-1])
    with pytest.raises(StoreError, match="shorter than its"):
        decode_span(ENC_U16_HIGH_BITS, b"\x01")


@given(st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=300),
       st.sampled_from([1 << 8, 1 << 16, 1 << 17, 151_936, 1 << 23, 1 << 24, 2**31]))
def test_round_trip(values: list[int], bound: int) -> None:
    ids = np.array([v % bound for v in values], dtype=TOKEN_DTYPE)
    enc, data = encode_span(ids)
    assert decode_span(enc, memoryview(data)) == ids.tobytes()
