"""Retokenization drift stored with each call and read per run (``calls.drift_checked`` / ``drift_at``), on
SQLite and PostgreSQL: no check → rate None (never NaN), every call drifted, drift at position 0."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sapwood.platform.cli import app
from sapwood.platform.codec import decode, encode
from sapwood.platform.errors import ValidationError
from sapwood.platform.events import ModelCall
from sapwood.platform.storage.drift import DriftedCall, drifted_calls
from sapwood.platform.store import Store
from tests.support.histories import drift_execution


def test_rate_per_run_on_the_boundaries(store: Store) -> None:
    store.apply(drift_execution("unchecked", [(False, None), (False, None)]).events)
    store.apply(drift_execution("all-drifted", [(True, 0), (True, 6)]).events)
    store.apply(drift_execution("mixed", [(False, None), (True, None), (True, 7), (True, None)]).events)
    store.apply(drift_execution("mixed", [(True, 3)]).events)
    got = {d.run_id: d for d in store.drift()}
    assert list(got) == ["all-drifted", "mixed", "unchecked"], "ordered by run id"
    unchecked = got["unchecked"]
    assert (unchecked.calls, unchecked.checked, unchecked.drifted, unchecked.first_position) == (2, 0, 0, None)
    assert unchecked.rate is None, "nothing checked: no rate (not NaN, not 0)"
    every = got["all-drifted"]
    assert (every.checked, every.drifted, every.rate, every.first_position) == (2, 2, 1.0, 0), "position 0 kept"
    mixed = got["mixed"]
    assert (mixed.calls, mixed.checked, mixed.drifted, mixed.first_position) == (5, 4, 2, 3)
    assert mixed.rate is not None
    assert math.isclose(mixed.rate, 0.5)
    assert store.drift("mixed") == [mixed]
    assert store.drift("missing") == []


def test_drifted_calls_keep_where_each_first_differed(store: Store) -> None:
    first = drift_execution("r", [(True, 0), (True, None), (True, 3)])
    second = drift_execution("r", [(True, 4)])
    store.apply(first.events)
    store.apply(second.events)
    calls = [e for e in first.events if isinstance(e, ModelCall)]
    later = next(e for e in second.events if isinstance(e, ModelCall))
    with store.transaction() as conn:
        got = drifted_calls(conn, "r", limit=10)
        assert drifted_calls(conn, "r", limit=1) == got[:1]
        assert drifted_calls(conn, "other", limit=10) == []
    assert got == [DriftedCall(calls[0].call_id, first.execution_id, calls[0].seq or 0, 0),
                   DriftedCall(calls[2].call_id, first.execution_id, calls[2].seq or 0, 3),
                   DriftedCall(later.call_id, second.execution_id, later.seq or 0, 4)]


def test_a_rebuild_from_the_events_keeps_the_drift(store: Store) -> None:
    store.apply(drift_execution("r", [(True, 0), (True, None), (False, None)]).events)
    before = store.drift()
    live = store.projection_hash()
    store.rebuild_projections()
    assert store.projection_hash() == live
    assert store.drift() == before


def test_the_drift_fields_are_validated_and_old_events_stay_valid() -> None:
    w = drift_execution("r", [(True, 4)])
    call = next(e for e in w.events if isinstance(e, ModelCall))
    back = decode(encode(call))
    assert isinstance(back, ModelCall)
    assert (back.drift_checked, back.drift_at) == (True, 4)
    old = ModelCall(**{k: v for k, v in {**call.scalar_fields(), **call.array_fields()}.items()
                       if k not in ("drift_checked", "drift_at")},
                    event_id=call.event_id, execution_id=call.execution_id, seq=call.seq)
    old.validate()  # an event written before the fields existed: unchecked
    assert (old.drift_checked, old.drift_at) == (False, None)
    for checked, at, what in [(False, 3, "drift_at needs drift_checked"), (True, -1, "drift_at must be"),
                              (True, True, "drift_at must be"), (True, 1.5, "drift_at must be"),
                              (1, None, "drift_checked must be a boolean")]:
        object.__setattr__(call, "drift_checked", checked)
        object.__setattr__(call, "drift_at", at)
        with pytest.raises(ValidationError, match=what):
            call.validate()


def test_sqlite_migration_round_trip_keeps_calls(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path / 'm.db'}", migrate=False)
    store.migrate("0010")
    store.migrate()
    store.apply(drift_execution("r", [(True, 2)]).events)
    store.downgrade("0010")
    store.migrate()
    (run,) = store.drift()
    assert (run.calls, run.checked, run.drifted, run.first_position) == (1, 0, 0, None), \
        "a call stored before 0011 reads as unchecked"
    store.close()


def test_sapwood_stats_prints_the_run_level_drift_table(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    store = Store.open(url)
    store.apply(drift_execution("sdk", [(False, None)]).events)
    runner = CliRunner()
    quiet = runner.invoke(app, ["stats", "--database-url", url])
    assert quiet.exit_code == 0, quiet.output
    assert "Retokenization drift" not in quiet.output, "no call checked: no table"
    store.apply(drift_execution("chat", [(True, 0), (True, None), (True, None), (True, 4)]).events)
    store.close()
    result = runner.invoke(app, ["stats", "--database-url", url], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    (row,) = [line for line in result.output.splitlines() if " chat " in line]
    assert [cell.strip() for cell in row.split("│")[1:-1]] == ["chat", "4", "4", "2", "50.00%", "0"]
    assert " sdk " not in result.output.split("Retokenization drift")[1], "unchecked runs are left out"


def test_a_drift_position_past_the_end_of_the_input_is_refused(store: Store) -> None:
    at_end = drift_execution("r", [(True, 4)])  # input: 3 prompt ids + 1 appended; a prompt may stop in the output
    store.apply(at_end.events)
    assert store.drift("r")[0].first_position == 4
    with pytest.raises(ValidationError, match="drift_at 5 is past the end of its input"):
        store.apply(drift_execution("r", [(True, 5)]).events)
