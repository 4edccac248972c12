"""Reads of executions, runs (training and rollout) and run queues (the writes are in :mod:`sapwood.api.writes`)."""

from __future__ import annotations

from typing import Any, Literal

from sqlalchemy.engine import Connection

from sapwood.api.cursors import Cursors, check_uuid
from sapwood.api.queries.trees import execution_out
from sapwood.platform import runs as platform_runs
from sapwood.platform.errors import UnknownParentError
from sapwood.platform.execution_filter import ExecutionFilter
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
