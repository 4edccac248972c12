"""Retokenization drift per run (the platform's :mod:`sapwood.platform.storage.drift` reads, as API dicts)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from sqlalchemy.engine import Connection

from sapwood.platform.storage.drift import RunDrift, drift_by_run, drifted_calls


def _run(d: RunDrift) -> dict[str, Any]:
    return {**asdict(d), "rate": d.rate}


def drift_table(conn: Connection) -> dict[str, Any]:
    """Every run with at least one checked call: checked, drifted, rate, first position."""
    return {"runs": [_run(d) for d in drift_by_run(conn) if d.checked]}


def run_drift(conn: Connection, run_id: str, *, limit: int) -> dict[str, Any]:
    """One run's drift and its earliest ``limit`` drifted calls; a run id with no calls reads all zeros."""
    (d,) = drift_by_run(conn, run_id) or [RunDrift(run_id, 0, 0, 0, None)]
    return {**_run(d), "drifted_calls": [asdict(c) for c in drifted_calls(conn, run_id, limit=limit)]}
