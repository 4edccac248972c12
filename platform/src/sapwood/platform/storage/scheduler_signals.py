"""The store's side of the live scheduler's signals: backlog per live run, in-flight executions, throughput.

Portable SQL over ``runs``, ``run_items``, ``executions``, ``policy_versions``, ``switch_phases`` and
``consumer_offsets`` (the same on SQLite and PostgreSQL); times are unix seconds, ``now`` is the
snapshot's time. The scheduler turns these rows into its ``Signals``.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from sapwood.platform import schema as t
from sapwood.platform.events.base import FINISH_STATUSES
from sapwood.platform.execution_filter import ExecutionFilter
from sapwood.platform.storage.runs_sql import execution_condition

_e = t.executions.c
_ri = t.run_items.c


@dataclass(frozen=True)
class LiveRunBacklog:
    """One live run's finished executions that no learner holds, and the policy versions around them."""

    run_id: str
    executions: int
    output_tokens: int
    oldest_policy_version: int | None
    """Oldest ``max_policy_version`` among those executions (None when there are none)."""
    latest_published: int | None
    """Newest version published under the run's ``config.publish_run_id`` (default the run itself)."""


def live_run_backlogs(conn: Connection, now: float) -> list[LiveRunBacklog]:
    """Per live run (by id): matching finished executions not queued, pending, or under a lease ended before ``now``."""
    out = []
    for run in conn.execute(sa.select(t.runs).where(t.runs.c.kind == "live").order_by(t.runs.c.run_id)).mappings():
        flt = ExecutionFilter.model_validate(run["filter"])
        unheld = sa.or_(_ri.execution_id.is_(None), _ri.state == "pending",
                        sa.and_(_ri.state == "claimed", _ri.lease_until < now))
        join = t.executions.outerjoin(t.run_items, sa.and_(_ri.run_id == run["run_id"],
                                                           _ri.execution_id == _e.execution_id))
        publish = (run["config"] or {}).get("publish_run_id", run["run_id"])
        latest_q = (sa.select(sa.func.max(t.policy_versions.c.version))
                    .where(t.policy_versions.c.run_id == publish).scalar_subquery())
        q = (sa.select(sa.func.count(), sa.func.coalesce(sa.func.sum(_e.n_output_tokens), 0),
                       sa.func.min(_e.max_policy_version), latest_q)
             .select_from(join)
             .where(execution_condition(flt), _e.status.in_(FINISH_STATUSES), unheld))
        n, tokens, oldest, latest = conn.execute(q).one()
        out.append(LiveRunBacklog(run["run_id"], int(n), int(tokens), None if oldest is None else int(oldest),
                                  None if latest is None else int(latest)))
    return out


def in_flight(conn: Connection, now: float) -> tuple[int, float]:
    """Executions still running, and the age (s) of the oldest at ``now`` (0 when none runs)."""
    n, oldest = conn.execute(sa.select(sa.func.count(), sa.func.min(_e.started_at))
                             .where(_e.status == "running")).one()
    return int(n), (now - float(oldest)) if oldest is not None else 0.0


def throughput(conn: Connection, now: float, window_s: float) -> dict[str, float]:
    """Rollout completions/s and tokens/s, the median duration of the last 256 finished, learner tokens/s."""
    since = now - window_s
    n, tokens = conn.execute(sa.select(sa.func.count(), sa.func.coalesce(sa.func.sum(_e.n_output_tokens), 0))
                             .where(_e.finished_at >= since)).one()
    recent = conn.execute(sa.select(_e.finished_at - _e.started_at).where(_e.finished_at.is_not(None))
                          .order_by(_e.finished_at.desc()).limit(256)).scalars().all()
    trained = conn.execute(sa.select(sa.func.coalesce(sa.func.sum(_e.n_output_tokens), 0))
                           .select_from(t.run_items.join(t.executions, _e.execution_id == _ri.execution_id))
                           .where(_ri.state == "done", _ri.done_at >= since)).scalar_one()
    active = conn.execute(sa.select(sa.func.count()).select_from(t.run_items)
                          .where(_ri.state == "claimed", _ri.lease_until >= now)).scalar_one()
    return {"completions_per_s": int(n) / window_s, "tokens_per_s": int(tokens) / window_s,
            "p50_s": float(statistics.median(recent)) if recent else 0.0,
            "learner_tokens_per_s": int(trained) / window_s, "train_active": float(active > 0)}


def recent_switch_phases(conn: Connection, last: int = 64) -> list[tuple[str, str, float]]:
    """``(cell_id, target role, duration_s)`` of the ``last`` switch phases recorded, newest first."""
    c = t.switch_phases.c
    rows = conn.execute(sa.select(c.cell_id, c.role, c.duration_s).order_by(c.at.desc(), c.event_id).limit(last))
    return [(str(cell_id), str(role), float(d)) for cell_id, role, d in rows]
