"""Every store signal the live scheduler reads, in one statement (one round trip per tick).

Each signal is a ``SELECT`` of one uniform row shape ``(kind, s1, s2, s3, v1, v2, v3, v4)`` (three
strings, four doubles; unused columns NULL), and the tick runs their ``UNION ALL``: the backlog of
each live run, the running executions, the throughput window, the latest finished durations, the
cells, the recent switch phases, the ingest's stored offsets, and a stamp of the live runs. The live
runs' filters are read once and kept (:class:`LiveRuns`), with the statement built for them (its
times are bound parameters, so it is built and compiled once, not per tick: building and compiling
it costs ~10× running it); the stamp in every snapshot says when the live runs changed, and only then
are they read again. Portable SQL (the same on SQLite and PostgreSQL); times are
unix seconds. Integers travel as doubles (exact below 2**53: counts, tokens, offsets).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.sql import Select

from sapwood.platform import schema as t
from sapwood.platform.events.base import FINISH_STATUSES
from sapwood.platform.events.cells import CellRole, CellTier
from sapwood.platform.execution_filter import ExecutionFilter
from sapwood.platform.storage.runs_sql import execution_condition

_e = t.executions.c
_ri = t.run_items.c
_r = t.runs.c
_TEXT = sa.String()
_REAL = sa.Float()
#: Finished durations the median is taken over.
RECENT_DURATIONS = 256


@dataclass(frozen=True)
class LiveRun:
    """A live run as the backlog signal needs it."""

    run_id: str
    filter: ExecutionFilter
    publish_run_id: str
    """The run whose published policy versions its backlog's staleness is measured against."""


@dataclass
class LiveRuns:
    """The live runs, read once and kept while the snapshots' stamp of them does not change."""

    runs: list[LiveRun] = field(default_factory=list)
    stamp: tuple[float, float] | None = None
    """(count, newest ``created_at``) of the live runs when ``runs`` was read; None: never read."""
    statements: dict[tuple[tuple[str, str] | None, int], Select[Any]] = field(default_factory=dict)
    """The snapshot statement for these runs, per (offsets, switch_last)."""

    def refresh(self, conn: Connection) -> None:
        rows = conn.execute(sa.select(t.runs).where(_r.kind == "live").order_by(_r.run_id)).mappings().all()
        self.runs = [LiveRun(r["run_id"], ExecutionFilter.model_validate(r["filter"]),
                             (r["config"] or {}).get("publish_run_id", r["run_id"])) for r in rows]
        self.stamp = (float(len(rows)), max((float(r["created_at"]) for r in rows), default=0.0))
        self.statements.clear()

    def statement(self, offsets: tuple[str, str] | None, switch_last: int) -> Select[Any]:
        key = (offsets, switch_last)
        if key not in self.statements:
            self.statements[key] = snapshot_statement(self.runs, offsets=offsets, switch_last=switch_last)
        return self.statements[key]


@dataclass(frozen=True)
class RunBacklogRow:
    """One live run's finished executions that no learner holds, and the policy versions around them."""

    run_id: str
    executions: int
    output_tokens: int
    oldest_policy_version: int | None
    latest_published: int | None


@dataclass(frozen=True)
class CellRow:
    """A cell as the ``cells`` projection holds it."""

    cell_id: str
    tier: CellTier
    role: CellRole
    capacity: int
    role_since: float
    last_heartbeat_at: float


@dataclass
class StoreSignals:
    """One snapshot of the store's signals (see the module docstring)."""

    backlogs: list[RunBacklogRow] = field(default_factory=list)
    in_flight: int = 0
    oldest_running_started_at: float | None = None
    completions: int = 0
    completed_tokens: int = 0
    trained_tokens: int = 0
    claimed_live: int = 0
    durations: list[float] = field(default_factory=list)
    cells: list[CellRow] = field(default_factory=list)
    switch_phases: list[tuple[str, str, float]] = field(default_factory=list)
    """``(cell_id, target role, duration_s)``, newest first."""
    stored_offsets: dict[int, int] = field(default_factory=dict)
    runs_stamp: tuple[float, float] = (0.0, 0.0)

    @property
    def p50_duration_s(self) -> float:
        return float(statistics.median(self.durations)) if self.durations else 0.0


def _row(kind: str, *, s1: Any = None, s2: Any = None, s3: Any = None, v1: Any = None, v2: Any = None,
         v3: Any = None, v4: Any = None) -> list[Any]:
    strings = [sa.cast(x if x is not None else sa.null(), _TEXT) for x in (s1, s2, s3)]
    reals = [sa.cast(x if x is not None else sa.null(), _REAL) for x in (v1, v2, v3, v4)]
    return [sa.literal(kind, _TEXT).label("kind"), *(c.label(f"s{i + 1}") for i, c in enumerate(strings)),
            *(c.label(f"v{i + 1}") for i, c in enumerate(reals))]


_NOW = sa.bindparam("now", type_=_REAL)
_SINCE = sa.bindparam("since", type_=_REAL)


def _backlog(run: LiveRun) -> Select[Any]:
    unheld = sa.or_(_ri.execution_id.is_(None), _ri.state == "pending",
                    sa.and_(_ri.state == "claimed", _ri.lease_until < _NOW))
    join = t.executions.outerjoin(t.run_items, sa.and_(_ri.run_id == run.run_id, _ri.execution_id == _e.execution_id))
    latest = (sa.select(sa.func.max(t.policy_versions.c.version))
              .where(t.policy_versions.c.run_id == run.publish_run_id).scalar_subquery())
    return (sa.select(*_row("backlog", s1=sa.literal(run.run_id), v1=sa.func.count(),
                            v2=sa.func.coalesce(sa.func.sum(_e.n_output_tokens), 0),
                            v3=sa.func.min(_e.max_policy_version), v4=latest))
            .select_from(join).where(execution_condition(run.filter), _e.status.in_(FINISH_STATUSES), unheld))


def snapshot_statement(runs: Sequence[LiveRun], *, offsets: tuple[str, str] | None = None,
                       switch_last: int = 64) -> Select[Any]:
    """The ``UNION ALL`` of every signal (``offsets``: the ingest's (group, topic) to read); execute it with the
    parameters ``now`` and ``since`` (the throughput window's start), unix seconds."""
    since, now = _SINCE, _NOW
    parts: list[Select[Any]] = [_backlog(run) for run in runs]
    parts.append(sa.select(*_row("in_flight", v1=sa.func.count(), v2=sa.func.min(_e.started_at)))
                 .where(_e.status == "running"))
    parts.append(sa.select(*_row("window", v1=sa.func.count(), v2=sa.func.coalesce(sa.func.sum(_e.n_output_tokens), 0)))
                 .where(_e.finished_at >= since))
    trained = (sa.select(sa.func.coalesce(sa.func.sum(_e.n_output_tokens), 0))
               .select_from(t.run_items.join(t.executions, _e.execution_id == _ri.execution_id))
               .where(_ri.state == "done", _ri.done_at >= since).scalar_subquery())
    parts.append(sa.select(*_row("learner", v1=trained, v2=sa.func.count())).select_from(t.run_items)
                 .where(_ri.state == "claimed", _ri.lease_until >= now))
    recent = (sa.select((_e.finished_at - _e.started_at).label("d")).where(_e.finished_at.is_not(None))
              .order_by(_e.finished_at.desc()).limit(RECENT_DURATIONS).subquery())
    parts.append(sa.select(*_row("duration", v1=recent.c.d)))
    c = t.cells.c
    parts.append(sa.select(*_row("cell", s1=c.cell_id, s2=c.tier, s3=c.role, v1=c.capacity, v2=c.role_since,
                                 v3=c.last_heartbeat_at)))
    p = t.switch_phases.c
    phases = (sa.select(p.cell_id, p.role, p.duration_s, p.at, p.event_id).order_by(p.at.desc(), p.event_id)
              .limit(switch_last).subquery())
    parts.append(sa.select(*_row("phase", s1=phases.c.cell_id, s2=phases.c.role, v1=phases.c.duration_s,
                                 v2=phases.c.at)))
    if offsets is not None:
        o = t.consumer_offsets.c
        parts.append(sa.select(*_row("offset", v1=o.partition, v2=o.next_offset))
                     .where(o.group_id == offsets[0], o.topic == offsets[1]))
    parts.append(sa.select(*_row("runs", v1=sa.func.count(), v2=sa.func.coalesce(sa.func.max(_r.created_at), 0.0)))
                 .where(_r.kind == "live"))
    return sa.select(sa.union_all(*parts).subquery())


def read_snapshot(conn: Connection, runs: LiveRuns, now: float, window_s: float, *,
                  offsets: tuple[str, str] | None = None, switch_last: int = 64) -> StoreSignals:
    """One snapshot in one round trip; a second (and a re-read of the runs) only when the live runs changed."""
    if runs.stamp is None:
        runs.refresh(conn)
    times = {"now": now, "since": now - window_s}
    out = _parse(conn.execute(runs.statement(offsets, switch_last), times).all())
    if out.runs_stamp != runs.stamp:
        runs.refresh(conn)
        out = _parse(conn.execute(runs.statement(offsets, switch_last), times).all())
    return out


def _int(x: Any) -> int | None:
    return None if x is None else int(x)


def _parse(rows: Sequence[Any]) -> StoreSignals:
    out = StoreSignals()
    phases: list[tuple[float, str, str, float]] = []
    for kind, s1, s2, s3, v1, v2, v3, v4 in rows:
        if kind == "backlog":
            out.backlogs.append(RunBacklogRow(str(s1), int(v1), int(v2), _int(v3), _int(v4)))
        elif kind == "in_flight":
            out.in_flight, out.oldest_running_started_at = int(v1), (None if v2 is None else float(v2))
        elif kind == "window":
            out.completions, out.completed_tokens = int(v1), int(v2)
        elif kind == "learner":
            out.trained_tokens, out.claimed_live = int(v1), int(v2)
        elif kind == "duration":
            out.durations.append(float(v1))
        elif kind == "cell":
            out.cells.append(CellRow(str(s1), cast(CellTier, s2), cast(CellRole, s3), int(v1), float(v2), float(v3)))
        elif kind == "phase":
            phases.append((float(v2), str(s1), str(s2), float(v1)))
        elif kind == "offset":
            out.stored_offsets[int(v1)] = int(v2)
        elif kind == "runs":
            out.runs_stamp = (float(v1), float(v2))
    out.backlogs.sort(key=lambda b: b.run_id)
    out.cells.sort(key=lambda c: c.cell_id)
    phases.sort(key=lambda ph: -ph[0])  # a UNION keeps no order: newest first again
    out.switch_phases = [(cell, role, d) for _, cell, role, d in phases]
    return out


__all__ = ["RECENT_DURATIONS", "CellRow", "LiveRun", "LiveRuns", "RunBacklogRow", "StoreSignals", "read_snapshot",
           "snapshot_statement"]
