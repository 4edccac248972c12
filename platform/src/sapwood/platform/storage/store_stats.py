"""Store-wide reads for statistics: row and token counts, finished executions, unique (content-addressed) tokens."""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from sapwood.platform import schema as t
from sapwood.platform.events.base import FINISH_STATUSES


def unique_tokens(conn: Connection) -> int:
    """Tokens of the distinct spans the tree's nodes use (each stored once however many nodes share it)."""
    distinct = sa.select(t.nodes.c.span_digest, t.nodes.c.length).distinct().subquery()
    return int(conn.execute(sa.select(sa.func.coalesce(sa.func.sum(distinct.c.length), 0))).scalar_one())


@dataclass(frozen=True, slots=True)
class StoreCounts:
    """Store-wide row and token counts (:meth:`sapwood.platform.store.Store.stats` reports them)."""

    events: int
    executions_by_status: dict[str, int]
    calls: int
    call_input_tokens: int
    """Σ input length over calls: what a store of full per-call inputs would hold, with the outputs."""
    call_output_tokens: int
    nodes: int
    tree_tokens: int
    """Σ node length: the tokens the tree holds (each shared run once per execution)."""
    fork_points: int
    compactions: int
    span_rows: int
    span_bytes: int


def store_counts(conn: Connection) -> StoreCounts:
    """Counts over the whole store (one statement per table)."""
    c, n = t.calls.c, t.nodes.c
    calls, inputs, outputs = conn.execute(
        sa.select(sa.func.count(), sa.func.coalesce(sa.func.sum(c.input_len), 0),
                  sa.func.coalesce(sa.func.sum(c.n_output), 0))).one()
    nodes, tree_tokens = conn.execute(sa.select(sa.func.count(), sa.func.coalesce(sa.func.sum(n.length), 0))).one()
    by_status = conn.execute(sa.select(t.executions.c.status, sa.func.count()).group_by(t.executions.c.status)).all()
    span_rows, span_bytes = conn.execute(
        sa.select(sa.func.count(), sa.func.coalesce(sa.func.sum(sa.func.length(t.spans.c.data)), 0))).one()
    return StoreCounts(
        events=int(conn.execute(sa.select(sa.func.count()).select_from(t.events)).scalar_one()),
        executions_by_status={str(s): int(k) for s, k in by_status},
        calls=int(calls), call_input_tokens=int(inputs), call_output_tokens=int(outputs),
        nodes=int(nodes), tree_tokens=int(tree_tokens),
        fork_points=int(conn.execute(sa.select(sa.func.count()).where(n.fork_branches > 0)).scalar_one()),
        compactions=int(conn.execute(sa.select(sa.func.count()).select_from(t.segments)).scalar_one()),
        span_rows=int(span_rows), span_bytes=int(span_bytes),
    )


def finished_executions(conn: Connection, run_id: str) -> int:
    """How many executions of ``run_id`` have finished (status success, timeout or error)."""
    c = t.executions.c
    q = sa.select(sa.func.count()).where(c.run_id == run_id, c.status.in_(FINISH_STATUSES))
    return int(conn.execute(q).scalar_one())
