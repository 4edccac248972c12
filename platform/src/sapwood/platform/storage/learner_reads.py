"""What the learner reads besides its batches: the newest published policy and the vocabulary size.

Portable SQL (the same on SQLite and PostgreSQL); the caller owns the transaction.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from sapwood.platform import schema as t

_pv = t.policy_versions.c


def latest_policy(conn: Connection, run_id: str) -> tuple[int, str] | None:
    """(version, checkpoint path) of the newest ``policy_published`` of ``run_id``, or None before the first."""
    row = conn.execute(sa.select(_pv.version, _pv.checkpoint).where(_pv.run_id == run_id)
                       .order_by(_pv.version.desc()).limit(1)).first()
    return (int(row.version), str(row.checkpoint)) if row else None


def latest_policy_record(conn: Connection, run_id: str) -> tuple[int, str, dict[str, Any]] | None:
    """(version, checkpoint path, metadata) of the newest ``policy_published`` of ``run_id``, or None."""
    row = conn.execute(sa.select(_pv.version, _pv.checkpoint, _pv.metadata).where(_pv.run_id == run_id)
                       .order_by(_pv.version.desc()).limit(1)).first()
    return (int(row.version), str(row.checkpoint), dict(row.metadata or {})) if row else None


def published_checkpoints(conn: Connection) -> set[str]:
    """Every checkpoint path any run published (what a checkpoint clean-up must keep)."""
    return {str(c) for (c,) in conn.execute(sa.select(_pv.checkpoint).where(_pv.checkpoint != ""))}


def policy_history(conn: Connection, run_id: str) -> list[tuple[int, str, dict[str, Any]]]:
    """Every ``policy_published`` of ``run_id`` as (version, checkpoint path, metadata), oldest first."""
    rows = conn.execute(sa.select(_pv.version, _pv.checkpoint, _pv.metadata).where(_pv.run_id == run_id)
                        .order_by(_pv.version))
    return [(int(r.version), str(r.checkpoint), dict(r.metadata or {})) for r in rows]


def run_item_states(conn: Connection, run_id: str) -> dict[str, str]:
    """Execution id → state (``pending`` / ``claimed`` / ``done``) of every item of ``run_id``'s queue."""
    ri = t.run_items.c
    return {str(e): str(s) for e, s in conn.execute(sa.select(ri.execution_id, ri.state).where(ri.run_id == run_id))}


def largest_vocab_size(conn: Connection) -> int | None:
    """The largest ``vocab_size`` any recorded execution declared, None if none declared one."""
    value = conn.execute(sa.select(sa.func.max(t.executions.c.vocab_size))).scalar()
    return None if value is None else int(value)


def rollout_lengths(conn: Connection, execution_ids: list[str]) -> dict[str, int]:
    """Model calls per execution (0 for one without calls), by execution id."""
    c = t.calls.c
    out = {e: 0 for e in execution_ids}
    ids = list(execution_ids)
    for start in range(0, len(ids), 500):
        rows = conn.execute(
            sa.select(c.execution_id, sa.func.count())
            .where(c.execution_id.in_(ids[start : start + 500]))
            .group_by(c.execution_id)
        )
        out.update({str(e): int(n) for e, n in rows})
    return out
