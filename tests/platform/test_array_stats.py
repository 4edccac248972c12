"""Batch-wide array figures equal the per-array computations they replace."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sapwood.platform.array_stats import batch_stats
from sapwood.platform.tokens import MAX_LOGPROB, digest_bytes

_ids = st.lists(st.integers(-(2**31), 2**31 - 1), max_size=40).map(lambda v: np.array(v, dtype=np.int32))
_lps = st.lists(
    st.one_of(st.floats(-50, 0, width=32), st.sampled_from([np.nan, np.inf, -np.inf, 0.5, MAX_LOGPROB, 2e-4])),
    max_size=40,
).map(lambda v: np.array(v, dtype=np.float32))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(_ids, _lps), max_size=12))
def test_figures_equal_per_array_reductions(arrays: list[np.ndarray]) -> None:
    stats = batch_stats(arrays)
    for arr in arrays:
        if arr.size == 0:
            assert stats.token_top(arr) is None
            assert stats.logprobs_ok(arr) is None
        elif arr.dtype == np.int32:
            assert stats.token_top(arr) == int(arr.view(np.uint32).max())
            assert stats.token_bits(arr) == int(np.bitwise_or.reduce(arr))
        else:
            expected = bool(np.all(np.isfinite(arr)) and arr.max() <= MAX_LOGPROB)
            assert stats.logprobs_ok(arr) is expected


def test_an_equal_array_that_was_not_in_the_batch_is_unknown() -> None:
    ids = np.arange(10, dtype=np.int32)
    stats = batch_stats([ids, ids])  # the same object twice counts once
    assert stats.token_top(ids) == 9
    assert stats.token_bits(ids) == 15
    assert stats.token_top(ids.copy()) is None, "figures are looked up by identity, never by a reused id"


def test_one_bad_value_flags_only_its_own_array() -> None:
    good, bad = np.full(5, -0.5, np.float32), np.array([-0.5, np.nan, -0.1], np.float32)
    stats = batch_stats([good, bad, good.copy()])
    assert stats.logprobs_ok(good) is True
    assert stats.logprobs_ok(bad) is False


def test_digests_when_asked_for() -> None:
    ids, lps = np.arange(6, dtype=np.int32), np.full(3, -0.25, np.float32)
    assert batch_stats([ids, lps]).digest(ids) is None, "no digests unless asked for"
    stats = batch_stats([ids, lps], digests=True)
    assert stats.digest(ids) == digest_bytes(ids.tobytes())
    assert stats.digest(lps) == digest_bytes(lps.tobytes())
    assert stats.digest(ids.copy()) is None
