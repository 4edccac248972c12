"""Executions, runs (training and rollout), run queues and partial-score revisions."""

from __future__ import annotations

import uuid
from typing import Any, Literal

from sqlalchemy.engine import Connection

from sapwood.api.queries.cursors import Cursors, check_uuid
from sapwood.api.queries.trees import execution_out
from sapwood.platform import runs as platform_runs
from sapwood.platform.apply import apply_events
from sapwood.platform.errors import ConflictError, UnknownParentError
from sapwood.platform.events import PartialScore
from sapwood.platform.runs import ExecutionFilter
from sapwood.platform.storage import executions as reads


def list_executions(conn: Connection, flt: ExecutionFilter, *, limit: int, cursor: str | None, cursors: Cursors,
                    order: Literal["asc", "desc"] = "desc") -> dict[str, Any]:
    """A page of executions matching ``flt``, keyset-paginated on (started_at, execution_id)."""
    kind = f"executions-{order}"
    after = None
    if cursor:
        started, eid = cursors.decode(cursor, kind, (float, str))
        after = (started, check_uuid(eid))
    rows = reads.executions_page(conn, flt, after=after, limit=limit + 1, order=order)
    more = len(rows) > limit
    rows = rows[:limit]
    last = rows[-1] if rows else None
    return {
        "items": [execution_out(r) for r in rows],
        "next_cursor": cursors.encode(kind, float(last["started_at"]), last["execution_id"]) if more and last else None,
    }


# -- runs ----------------------------------------------------------------------------------------------
def _runs_out(conn: Connection, run_ids: list[str]) -> list[dict[str, Any]]:
    if not run_ids:
        return []
    training = reads.run_rows(conn, run_ids)
    recorded = reads.execution_counts(conn, run_ids)
    progress = reads.item_counts(conn, run_ids)
    out = []
    for run_id in run_ids:
        run = training.get(run_id)
        prog = None
        if run is not None:
            p = progress.get(run_id, {"pending": 0, "claimed": 0, "done": 0})
            prog = {**p, "total": sum(p.values())}
        out.append({
            "run_id": run_id,
            "kind": run["kind"] if run else None,
            "filter": run["filter"] if run else None,
            "seed": run["seed"] if run else None,
            "config": run["config"] if run else None,
            "description": run["description"] if run else None,
            "created_at": run["created_at"] if run else None,
            "progress": prog,
            "executions": recorded.get(run_id, {}),
        })
    return out


def list_runs(conn: Connection, *, limit: int, cursor: str | None, cursors: Cursors) -> dict[str, Any]:
    """Training runs and the run ids executions were recorded under, ordered by run id."""
    after = cursors.decode(cursor, "runs", (str,))[0] if cursor else None
    run_ids = reads.run_ids_page(conn, after=after, limit=limit + 1)
    more = len(run_ids) > limit
    run_ids = run_ids[:limit]
    return {"items": _runs_out(conn, run_ids),
            "next_cursor": cursors.encode("runs", run_ids[-1]) if more else None}


def get_run(conn: Connection, run_id: str) -> dict[str, Any]:
    (out,) = _runs_out(conn, [run_id])
    if out["kind"] is None and not out["executions"]:
        raise UnknownParentError(f"run {run_id!r} does not exist")
    return out


def create_run(conn: Connection, *, run_id: str | None, kind: Literal["replay", "live"], flt: ExecutionFilter,
               seed: int, description: str, config: dict[str, Any]) -> dict[str, Any]:
    """Create a training run from historical executions (see :func:`sapwood.platform.runs.create_run`)."""
    run_id = run_id or f"{kind}-{uuid.uuid4().hex[:12]}"
    queued = platform_runs.create_run(conn, run_id, flt, kind=kind, seed=seed, config=config, description=description)
    return {**get_run(conn, run_id), "queued": queued}


def run_items(conn: Connection, run_id: str, *, limit: int, cursor: str | None, cursors: Cursors) -> dict[str, Any]:
    """A run's queue in its order (the order learners claim it in)."""
    platform_runs.get_run(conn, run_id)
    position = 0
    after = None
    if cursor:
        key, eid, position = cursors.decode(cursor, f"items:{run_id}", (int, str, int))
        after = (key, check_uuid(eid))
    rows = reads.run_items_page(conn, run_id, after=after, limit=limit + 1)
    more = len(rows) > limit
    rows = rows[:limit]
    items = [{"position": position + i, **dict(r)} for i, r in enumerate(rows)]
    nxt = None
    if more and rows:
        last = rows[-1]
        nxt = cursors.encode(f"items:{run_id}", int(last["order_key"]), last["execution_id"], position + len(rows))
    return {"run_id": run_id, "items": items, "next_cursor": nxt}


# -- scores --------------------------------------------------------------------------------------------
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
