"""Executions, runs (training and rollout), run queues and partial-score revisions."""

from __future__ import annotations

import uuid
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from sapwood.api.queries.cursors import Cursors, check_uuid
from sapwood.api.queries.trees import execution_out
from sapwood.platform import runs as platform_runs
from sapwood.platform import schema as t
from sapwood.platform.apply import apply_events
from sapwood.platform.errors import ConflictError, UnknownParentError
from sapwood.platform.events import PartialScore
from sapwood.platform.runs import ExecutionFilter

_e = t.executions.c


def list_executions(conn: Connection, flt: ExecutionFilter, *, limit: int, cursor: str | None, cursors: Cursors,
                    order: Literal["asc", "desc"] = "desc") -> dict[str, Any]:
    """A page of executions matching ``flt``, keyset-paginated on (started_at, execution_id)."""
    q = sa.select(t.executions).where(flt.where())
    kind = f"executions-{order}"
    if cursor:
        started, eid = cursors.decode(cursor, kind, (float, str))
        eid = check_uuid(eid)
        if order == "desc":
            q = q.where(sa.or_(_e.started_at < started, sa.and_(_e.started_at == started, _e.execution_id < eid)))
        else:
            q = q.where(sa.or_(_e.started_at > started, sa.and_(_e.started_at == started, _e.execution_id > eid)))
    if order == "desc":
        q = q.order_by(_e.started_at.desc(), _e.execution_id.desc())
    else:
        q = q.order_by(_e.started_at.asc(), _e.execution_id.asc())
    rows = conn.execute(q.limit(limit + 1)).mappings().all()
    more = len(rows) > limit
    rows = rows[:limit]
    last = rows[-1] if rows else None
    return {
        "items": [execution_out(r) for r in rows],
        "next_cursor": cursors.encode(kind, float(last["started_at"]), last["execution_id"]) if more and last else None,
    }


# -- runs ----------------------------------------------------------------------------------------------
def _progress(conn: Connection, run_ids: list[str]) -> dict[str, dict[str, int]]:
    ri = t.run_items.c
    out: dict[str, dict[str, int]] = {}
    rows = conn.execute(sa.select(ri.run_id, ri.state, sa.func.count()).where(ri.run_id.in_(run_ids))
                        .group_by(ri.run_id, ri.state))
    for run_id, state, n in rows:
        out.setdefault(run_id, {"pending": 0, "claimed": 0, "done": 0})[state] = int(n)
    return out


def _runs_out(conn: Connection, run_ids: list[str]) -> list[dict[str, Any]]:
    if not run_ids:
        return []
    training = {r["run_id"]: dict(r) for r in conn.execute(sa.select(t.runs).where(t.runs.c.run_id.in_(run_ids)))
                .mappings()}
    recorded: dict[str, dict[str, int]] = {}
    for run_id, status, n in conn.execute(sa.select(_e.run_id, _e.status, sa.func.count())
                                          .where(_e.run_id.in_(run_ids)).group_by(_e.run_id, _e.status)):
        recorded.setdefault(run_id, {})[status] = int(n)
    progress = _progress(conn, run_ids)
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
    ids = sa.union(sa.select(t.runs.c.run_id.label("run_id")), sa.select(_e.run_id.label("run_id"))).subquery()
    q = sa.select(ids.c.run_id)
    if cursor:
        (after,) = cursors.decode(cursor, "runs", (str,))
        q = q.where(ids.c.run_id > after)
    run_ids = [r[0] for r in conn.execute(q.order_by(ids.c.run_id).limit(limit + 1))]
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
    ri = t.run_items.c
    q = sa.select(ri.execution_id, ri.order_key, ri.state, ri.claimed_by, ri.attempts, ri.done_at).where(
        ri.run_id == run_id)
    position = 0
    if cursor:
        key, eid, position = cursors.decode(cursor, f"items:{run_id}", (int, str, int))
        eid = check_uuid(eid)
        q = q.where(sa.or_(ri.order_key > key, sa.and_(ri.order_key == key, ri.execution_id > eid)))
    rows = conn.execute(q.order_by(ri.order_key, ri.execution_id).limit(limit + 1)).mappings().all()
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
    q = sa.select(_e.last_seq, _e.score_revision, _e.status).where(_e.execution_id == execution_id)
    if conn.dialect.name == "postgresql":
        q = q.with_for_update()
    row = conn.execute(q).first()
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
    s = t.scores.c
    out = conn.execute(sa.select(s.event_id, s.revision, s.score, s.components, s.scorer, s.note, s.created_at)
                       .where(s.event_id == event.event_id)).mappings().one()
    return dict(out)
