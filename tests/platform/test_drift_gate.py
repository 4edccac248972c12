"""``sapwood drift check --max-rate``: the CI gate on a run's retokenization drift rate, on SQLite and
PostgreSQL, with rates exactly at the limit, one call above it, zero, one and nothing checked."""

from __future__ import annotations

from fractions import Fraction

import pytest
from typer.testing import CliRunner

from sapwood.platform.cli import app
from sapwood.platform.storage.drift import RunDrift, over_limit, parse_max_rate
from sapwood.platform.store import Store
from tests.support.histories import drift_execution


def _url(store: Store) -> str:
    return store.engine.url.render_as_string(hide_password=False)


def _checks(drifted: int, checked: int) -> list[tuple[bool, int | None]]:
    return [(True, 3 if k < drifted else None) for k in range(checked)]


def _gate(store: Store, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["drift", "check", "--database-url", _url(store), *args],
                                env={"COLUMNS": "300"})
    return result.exit_code, result.output


def test_a_rate_exactly_at_the_limit_passes_and_one_drift_more_fails(store: Store) -> None:
    store.apply(drift_execution("at", _checks(3, 100)).events)  # 3 % exactly
    store.apply(drift_execution("above", _checks(4, 100)).events)  # 4 %
    code, out = _gate(store, "--max-rate", "0.03", "--run-id", "at")
    assert code == 0, out
    assert "run 'at': drift rate 3/100 = 3.00% is within the limit 3.00%" in out
    code, out = _gate(store, "--max-rate", "0.03")
    assert code == 1, out
    assert "run 'above': drift rate 4/100 = 4.00% is above the limit 3.00%" in out
    assert "run 'at': drift rate 3/100 = 3.00% is within" in out


def test_a_rate_of_one_passes_only_a_limit_of_one_and_zero_passes_zero(store: Store) -> None:
    store.apply(drift_execution("all", _checks(2, 2)).events)
    store.apply(drift_execution("none", _checks(0, 5)).events)
    assert _gate(store, "--max-rate", "1", "--run-id", "all")[0] == 0
    assert _gate(store, "--max-rate", "0.999", "--run-id", "all")[0] == 1
    assert _gate(store, "--max-rate", "0", "--run-id", "none")[0] == 0
    code, out = _gate(store, "--max-rate", "0", "--run-id", "none", "--run-id", "all")
    assert code == 1, out
    assert "run 'all': drift rate 2/2 = 100.00% is above the limit 0.00%" in out


def test_nothing_to_gate_exits_2_naming_why(store: Store) -> None:
    code, out = _gate(store, "--max-rate", "0.03")
    assert code == 2, out
    assert "no run has a chat call checked for drift" in out
    store.apply(drift_execution("sdk", [(False, None), (False, None)]).events)
    code, out = _gate(store, "--max-rate", "0.03", "--run-id", "sdk")
    assert code == 2, out
    assert "run 'sdk' has 2 calls, none checked for drift" in out
    code, out = _gate(store, "--max-rate", "0.03", "--run-id", "missing")
    assert code == 2, out
    assert "run 'missing' has no recorded calls" in out


@pytest.mark.parametrize("bad", ["-0.01", "1.5", "nan", "inf", "three", ""])
def test_a_limit_outside_0_1_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="drift-rate limit must"):
        parse_max_rate(bad)


def test_the_comparison_is_exact_at_fractions_a_float_rounds() -> None:
    third = RunDrift("r", calls=3, checked=3, drifted=1, first_position=0)
    assert over_limit([third], Fraction(1, 3)) == []
    assert over_limit([third], parse_max_rate("0.3333333333333333")) == [third], "1/3 > 0.3333333333333333"
    assert parse_max_rate("0.1") == Fraction(1, 10), "the decimal the user wrote, not the nearest float"
    tenth = RunDrift("t", calls=10, checked=10, drifted=1, first_position=0)
    assert over_limit([tenth], parse_max_rate("0.1")) == []
    unchecked = RunDrift("u", calls=4, checked=0, drifted=0, first_position=None)
    assert over_limit([unchecked], Fraction(0)) == [], "no checked call: no rate, not over"
