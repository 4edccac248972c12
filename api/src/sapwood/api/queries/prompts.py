"""Reads of a run's prompt queue: sample progress per epoch (``sapwood.platform.prompts``)."""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import Connection

from sapwood.platform import runs as platform_runs
from sapwood.platform.prompts import prompt_progress

STATES = ("pending", "claimed", "done", "abandoned")


def prompt_progress_of_run(conn: Connection, run_id: str) -> dict[str, Any]:
    """Per epoch (ascending) and in total: samples pending / claimed / done, and abandoned executions.

    Raises :class:`UnknownParentError` for an unknown run; a run without prompts has no epochs.
    Samples whose execution finished are marked done first (the queue's sync), so it needs a write
    transaction.
    """
    platform_runs.get_run(conn, run_id)
    per_epoch = prompt_progress(conn, run_id)
    epochs = [{"epoch": epoch, **{s: counts[s] for s in STATES}} for epoch, counts in per_epoch.items()]
    total = {s: sum(e[s] for e in epochs) for s in STATES}
    samples = total["pending"] + total["claimed"] + total["done"]
    return {
        "run_id": run_id,
        "epochs": epochs,
        "total": total,
        "samples": samples,
        "fraction_done": total["done"] / samples if samples else None,
    }
