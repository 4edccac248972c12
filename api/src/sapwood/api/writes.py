"""The API's writes: training runs and partial-score revisions (``api/queries/`` only reads)."""

from __future__ import annotations

import uuid
from typing import Any, Literal

from sqlalchemy.engine import Connection

from sapwood.api.queries.executions import get_run
from sapwood.platform import runs as platform_runs
from sapwood.platform.apply import apply_events
from sapwood.platform.errors import ConflictError, UnknownParentError
from sapwood.platform.events import PartialScore
from sapwood.platform.execution_filter import ExecutionFilter
from sapwood.platform.storage import executions as reads


def create_run(conn: Connection, *, run_id: str | None, kind: Literal["replay", "live"], flt: ExecutionFilter,
               seed: int, description: str, config: dict[str, Any]) -> dict[str, Any]:
    """Create a training run from historical executions (see :func:`sapwood.platform.runs.create_run`)."""
    run_id = run_id or f"{kind}-{uuid.uuid4().hex[:12]}"
    queued = platform_runs.create_run(conn, run_id, flt, kind=kind, seed=seed, config=config, description=description)
    return {**get_run(conn, run_id), "queued": queued}


def add_score(conn: Connection, execution_id: str, *, score: float, components: dict[str, float], scorer: str,
              note: str, expected_revision: int | None) -> dict[str, Any]:
    """Append the next partial-score revision as an event (seq = last_seq + 1, revision = last + 1).

    Only finished executions: while one runs, its producer owns its sequence numbers.
    """
    row = reads.lock_for_scoring(conn, execution_id)
    if row is None:
        raise UnknownParentError(f"execution {execution_id} does not exist")
    if row.status == "running":
        raise ConflictError(f"execution {execution_id} is still running; score it after it finishes "
                            "(its producer assigns its sequence numbers until then)")
    revision = 0 if row.score_revision is None else row.score_revision + 1
    if expected_revision is not None and expected_revision != revision:
        raise ConflictError(f"expected_revision {expected_revision}, but the next revision is {revision}")
    event = PartialScore(execution_id=execution_id, seq=row.last_seq + 1, score=float(score),
                         components=dict(components), scorer=scorer, revision=revision, note=note)
    apply_events(conn, [event])
    return reads.score_event(conn, event.event_id)
