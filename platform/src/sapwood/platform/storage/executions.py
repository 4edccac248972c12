"""Execution reads: one execution, pages of executions, runs with their progress, partial-score rows.

Dialect-free (the same statements on SQLite and PostgreSQL; ``FOR UPDATE`` renders as nothing on
SQLite, whose writers hold the database lock anyway). Callers own the transaction.
"""

from __future__ import annotations

from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy.engine import Connection, RowMapping

from sapwood.platform import schema as t
from sapwood.platform.errors import UnknownParentError
from sapwood.platform.execution_filter import ExecutionFilter
from sapwood.platform.storage.runs_sql import execution_condition

_e = t.executions.c
_s = t.scores.c
_ri = t.run_items.c
_SCORE_COLUMNS = (_s.event_id, _s.revision, _s.score, _s.components, _s.scorer, _s.note, _s.created_at)


def execution_row(conn: Connection, execution_id: str) -> dict[str, Any]:
    """The execution's ``executions`` row; :class:`UnknownParentError` if there is none."""
    row = conn.execute(sa.select(t.executions).where(_e.execution_id == execution_id)).mappings().first()
    if row is None:
        raise UnknownParentError(f"execution {execution_id} does not exist")
    return dict(row)


def execution_version(conn: Connection, execution_id: str) -> int:
    """``last_seq`` of the execution: every change to it is an event that bumps it (a cache key)."""
    seq = conn.execute(sa.select(_e.last_seq).where(_e.execution_id == execution_id)).scalar_one_or_none()
    if seq is None:
        raise UnknownParentError(f"execution {execution_id} does not exist")
    return int(seq)


def executions_page(conn: Connection, flt: ExecutionFilter, *, after: tuple[float, str] | None, limit: int,
                    order: Literal["asc", "desc"] = "asc") -> list[RowMapping]:
    """Up to ``limit`` executions matching ``flt`` after ``(started_at, execution_id)`` in ``order`` (rows as
    read-only mappings: copy one to change it)."""
    q = sa.select(t.executions).where(execution_condition(flt))
    if after is not None:
        started, eid = after
        if order == "desc":
            q = q.where(sa.or_(_e.started_at < started, sa.and_(_e.started_at == started, _e.execution_id < eid)))
        else:
            q = q.where(sa.or_(_e.started_at > started, sa.and_(_e.started_at == started, _e.execution_id > eid)))
    if order == "desc":
        q = q.order_by(_e.started_at.desc(), _e.execution_id.desc())
    else:
        q = q.order_by(_e.started_at, _e.execution_id)
    return list(conn.execute(q.limit(limit)).mappings().all())


def scores(conn: Connection, execution_id: str) -> list[dict[str, Any]]:
    """The execution's partial-score revisions, oldest first."""
    rows = conn.execute(sa.select(*_SCORE_COLUMNS).where(_s.execution_id == execution_id).order_by(_s.revision))
    return [dict(r) for r in rows.mappings()]


def score_event(conn: Connection, event_id: str) -> dict[str, Any]:
    """The partial-score row written by event ``event_id``."""
    return dict(conn.execute(sa.select(*_SCORE_COLUMNS).where(_s.event_id == event_id)).mappings().one())


def lock_for_scoring(conn: Connection, execution_id: str) -> Any:
    """``last_seq score_revision status`` of the execution, row-locked until the commit (None if absent)."""
    return conn.execute(sa.select(_e.last_seq, _e.score_revision, _e.status)
                        .where(_e.execution_id == execution_id).with_for_update()).first()


# -- runs ----------------------------------------------------------------------------------------------
def run_ids_page(conn: Connection, *, after: str | None, limit: int) -> list[str]:
    """Ids of training runs and of runs executions were recorded under, ordered, after ``after``."""
    ids = sa.union(sa.select(t.runs.c.run_id.label("run_id")), sa.select(_e.run_id.label("run_id"))).subquery()
    q = sa.select(ids.c.run_id)
    if after is not None:
        q = q.where(ids.c.run_id > after)
    return [r[0] for r in conn.execute(q.order_by(ids.c.run_id).limit(limit))]


def run_rows(conn: Connection, run_ids: list[str]) -> dict[str, dict[str, Any]]:
    """run id → its ``runs`` row (training runs only)."""
    rows = conn.execute(sa.select(t.runs).where(t.runs.c.run_id.in_(run_ids))).mappings()
    return {r["run_id"]: dict(r) for r in rows}


def execution_counts(conn: Connection, run_ids: list[str]) -> dict[str, dict[str, int]]:
    """run id → executions recorded under it per status."""
    out: dict[str, dict[str, int]] = {}
    for run_id, status, n in conn.execute(sa.select(_e.run_id, _e.status, sa.func.count())
                                          .where(_e.run_id.in_(run_ids)).group_by(_e.run_id, _e.status)):
        out.setdefault(run_id, {})[status] = int(n)
    return out


def item_counts(conn: Connection, run_ids: list[str]) -> dict[str, dict[str, int]]:
    """run id → its queue's items per state (``pending claimed done``; runs without items absent)."""
    out: dict[str, dict[str, int]] = {}
    rows = conn.execute(sa.select(_ri.run_id, _ri.state, sa.func.count()).where(_ri.run_id.in_(run_ids))
                        .group_by(_ri.run_id, _ri.state))
    for run_id, state, n in rows:
        out.setdefault(run_id, {"pending": 0, "claimed": 0, "done": 0})[state] = int(n)
    return out


def run_items_page(conn: Connection, run_id: str, *, after: tuple[int, str] | None,
                   limit: int) -> list[dict[str, Any]]:
    """Up to ``limit`` items of the run's queue in claim order after ``(order_key, execution_id)``."""
    q = sa.select(_ri.execution_id, _ri.order_key, _ri.state, _ri.claimed_by, _ri.attempts, _ri.done_at).where(
        _ri.run_id == run_id)
    if after is not None:
        key, eid = after
        q = q.where(sa.or_(_ri.order_key > key, sa.and_(_ri.order_key == key, _ri.execution_id > eid)))
    return [dict(r) for r in conn.execute(q.order_by(_ri.order_key, _ri.execution_id).limit(limit)).mappings()]
