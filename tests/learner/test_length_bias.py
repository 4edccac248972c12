"""The two-sample KS permutation test behind the campaign's length-bias check."""

from __future__ import annotations

import random

import pytest

from sapwood.learner.length_bias import ks_distance, permutation_ks


def test_ks_distance_boundaries() -> None:
    assert ks_distance([1, 2, 3], [1, 2, 3]) == 0.0
    assert ks_distance([1, 2], [3, 4]) == 1.0
    assert ks_distance([1, 2, 3, 4], [3, 4]) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="non-empty"):
        ks_distance([], [1])


def test_permutation_test_flags_a_shift_and_not_the_same_distribution() -> None:
    rng = random.Random(1)
    same_a = [rng.randint(1, 8) for _ in range(60)]
    same_b = [rng.randint(1, 8) for _ in range(200)]
    short = [rng.randint(1, 4) for _ in range(60)]  # re-issued samples biased toward short rollouts
    _, p_same = permutation_ks(same_a, same_b, rounds=500)
    ks_short, p_short = permutation_ks(short, same_b, rounds=500)
    assert p_same > 0.05
    assert p_short < 0.01
    assert ks_short > 0.4
    with pytest.raises(ValueError, match="rounds"):
        permutation_ks(same_a, same_b, rounds=0)
