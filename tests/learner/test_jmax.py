"""Jmax: one default, one check; 0 and negative values are clear errors wherever Jmax is given."""

from __future__ import annotations

import pytest

from sapwood.learner.assembly import select_leaves
from sapwood.learner.batch import TreeBatchBuilder
from sapwood.learner.config import DEFAULT_JMAX, LearnerConfig, SourceConfig, check_jmax
from sapwood.learner.errors import ConfigError


def test_the_default_is_one_value_used_by_both_configs() -> None:
    assert SourceConfig().jmax == DEFAULT_JMAX
    assert LearnerConfig().jmax == DEFAULT_JMAX


@pytest.mark.parametrize("bad", [0, -1, -8])
def test_jmax_below_one_is_refused_everywhere(bad: int) -> None:
    with pytest.raises(ConfigError, match=f"jmax must be >= 1 .*got {bad}"):
        check_jmax(bad)
    with pytest.raises(ConfigError, match="jmax must be >= 1"):
        SourceConfig(jmax=bad)
    with pytest.raises(ConfigError, match="jmax must be >= 1"):
        LearnerConfig(jmax=bad)
    with pytest.raises(ConfigError, match="jmax must be >= 1"):
        select_leaves(["a", "b"], bad, seed=0)
    with pytest.raises(ConfigError, match="jmax must be >= 1"):
        TreeBatchBuilder().build().validate(jmax=bad)


@pytest.mark.parametrize("bad", [1.5, "2", True])
def test_jmax_must_be_an_int(bad: object) -> None:
    with pytest.raises(ConfigError, match="jmax must be an int"):
        check_jmax(bad)  # type: ignore[arg-type]


def test_jmax_one_is_the_smallest_valid_value() -> None:
    assert check_jmax(1) == 1
    assert SourceConfig(jmax=1).jmax == 1
    assert select_leaves(["c", "a", "b"], 1, seed=0) in (["a"], ["b"], ["c"])
