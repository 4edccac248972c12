"""Training runs: which executions a run consumes, and exactly-once claims for its learners.

A run is a filter over executions plus a queue (``run_items``). A *replay* run snapshots the
matching history when it is created, in an order fixed by its seed (same filter + seed ⇒
same executions, same order). A *live* run keeps adding newly finished executions that match.
Learners claim pending items (``FOR UPDATE SKIP LOCKED`` on PostgreSQL) under a lease; a
crashed learner's items become claimable again when the lease expires; an item is marked
done only by the learner that still holds it, so nothing is trained twice in a run.

This module validates and keeps the public functions; the SQL is the run queue's
(:mod:`sapwood.platform.storage.runs`, one implementation per dialect).
"""

from __future__ import annotations

import json
import time
from typing import Any, Literal

from sqlalchemy.engine import Connection

from sapwood.platform.errors import UnknownParentError, ValidationError
from sapwood.platform.execution_filter import ExecutionFilter as ExecutionFilter  # the run API: a run is a filter
from sapwood.platform.json_values import check_json_numbers
from sapwood.platform.run_ids import check_run_id
from sapwood.platform.storage.backends import run_queue

#: Limits of a run's free-form ``config``: nesting depth and size of its JSON text.
CONFIG_MAX_DEPTH = 32
CONFIG_MAX_BYTES = 64 * 1024


def check_storable_json(value: Any, where: str, *, max_depth: int = CONFIG_MAX_DEPTH,
                        max_bytes: int = CONFIG_MAX_BYTES) -> None:
    """Reject JSON that either backend could store but not read back (or not store at all).

    Checked iteratively (no recursion limit to hit): nesting at most ``max_depth`` levels, strings
    and keys without NUL or lone surrogates (PostgreSQL refuses them; SQLite stores text that no
    UTF-8 reader decodes), numbers that are IEEE-754 doubles exactly (named by their path, see
    :func:`sapwood.platform.json_values.check_json_numbers`), at most ``max_bytes`` of UTF-8 JSON text.
    """
    check_json_numbers(value, where, max_depth=max_depth)
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > max_depth:
                raise ValidationError(f"{where}: nested deeper than {max_depth} levels")
            children = [*item.keys(), *item.values()] if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
        elif isinstance(item, str):
            if "\x00" in item:
                raise ValidationError(f"{where}: text must not contain NUL characters")
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                raise ValidationError(f"{where}: text must be valid Unicode (no lone surrogates)") from None
        elif isinstance(item, int | float):
            pass  # checked above
        elif item is not None and not isinstance(item, bool):
            raise ValidationError(f"{where}: {type(item).__name__} is not a JSON value")
    size = len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())
    if size > max_bytes:
        raise ValidationError(f"{where}: {size} bytes of JSON, at most {max_bytes}")


def create_run(
    conn: Connection,
    run_id: str,
    flt: ExecutionFilter,
    *,
    kind: Literal["live", "replay"] = "replay",
    seed: int = 0,
    config: dict[str, Any] | None = None,
    description: str = "",
) -> int:
    """Create a run; a replay run snapshots the finished executions matching ``flt``. Returns items queued."""
    if kind not in ("live", "replay"):
        raise ValidationError(f"run kind must be 'live' or 'replay', got {kind!r}")
    check_run_id(run_id)
    check_storable_json(config or {}, "config")
    check_storable_json(description, "description")
    run_queue(conn).create(conn, run_id, kind=kind, filter_json=flt.model_dump(exclude_none=True), seed=seed,
                           config=config or {}, description=description, created_at=time.time())
    return sync_run(conn, run_id) if kind == "replay" else 0


def get_run(conn: Connection, run_id: str) -> dict[str, Any]:
    """The run's row; :class:`UnknownParentError` if there is no such run."""
    row = run_queue(conn).get(conn, run_id)
    if row is None:
        raise UnknownParentError(f"run {run_id!r} does not exist")
    return row


def sync_run(conn: Connection, run_id: str) -> int:
    """Queue finished executions matching the run's filter that are not queued yet; return how many."""
    run = get_run(conn, run_id)
    flt = ExecutionFilter.model_validate(run["filter"])
    return run_queue(conn).snapshot(conn, run_id, flt, kind=run["kind"], seed=run["seed"])


def claim(conn: Connection, run_id: str, learner_id: str, limit: int, *, lease_s: float = 300.0) -> list[str]:
    """Claim up to ``limit`` items of ``run_id`` for ``learner_id`` (in run order); return execution ids."""
    return run_queue(conn).claim(conn, run_id, learner_id, limit, lease_s=lease_s)


def renew(conn: Connection, run_id: str, learner_id: str, execution_ids: list[str], *, lease_s: float = 300.0) -> int:
    """Extend the leases ``learner_id`` still holds among ``execution_ids`` by ``lease_s`` from now; how many."""
    return run_queue(conn).renew(conn, run_id, learner_id, execution_ids, lease_s=lease_s)


def complete(conn: Connection, run_id: str, learner_id: str, execution_ids: list[str]) -> list[str]:
    """Mark items done if ``learner_id`` still holds them; return the ids it no longer holds (taken over)."""
    return run_queue(conn).complete(conn, run_id, learner_id, execution_ids)


def release(conn: Connection, run_id: str, learner_id: str, execution_ids: list[str]) -> None:
    """Give claimed items back (e.g. a batch failed before training)."""
    run_queue(conn).release(conn, run_id, learner_id, execution_ids)


def release_holder(conn: Connection, run_id: str, learner_id: str) -> int:
    """Give back everything ``learner_id`` still claims (its previous process died before completing it)."""
    return run_queue(conn).release_holder(conn, run_id, learner_id)


def release_predecessors(conn: Connection, run_id: str, identity: str, learner_id: str) -> int:
    """Give back what earlier processes of the stable ``identity`` still claim (holders ``identity#…`` other
    than ``learner_id``), so a restart takes its predecessor's work over without waiting for the lease."""
    return run_queue(conn).release_predecessors(conn, run_id, identity, learner_id)


def run_progress(conn: Connection, run_id: str) -> dict[str, int]:
    """Items per state for ``run_id``."""
    return run_queue(conn).progress(conn, run_id)
