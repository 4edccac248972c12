"""What the SQLite and PostgreSQL event appliers share: the planner's reads, and the writes no COPY speeds up.

:class:`SqlStoredState` answers :class:`~sapwood.platform.planner.ports.StoredState` with
SQLAlchemy Core; each dialect's applier subclasses it for the id look-ups it does its own way
(:meth:`~SqlStoredState.prior_events`, :meth:`~SqlStoredState.executions`,
:meth:`~SqlStoredState.nodes`). The ``write_*`` functions are the update and cell steps both
appliers run after their inserts.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from sapwood.platform import schema as t
from sapwood.platform.phase_timer import PhaseTimer
from sapwood.platform.planner.ports import ChildNode, PlannedWrites, Row, SpanSink
from sapwood.platform.replays import Prior
from sapwood.platform.storage.spans import existing_digests
from sapwood.platform.storage.trees import TreeReader
from sapwood.platform.tokens import TokenArray
from sapwood.platform.tree import NodeRecord, Role

#: Columns of a node the planner reads.
NODE_FIELDS = sa.select(t.nodes.c.node_id, t.nodes.c.execution_id, t.nodes.c.parent_id, t.nodes.c.prev_segment_node,
                        t.nodes.c.role, t.nodes.c.depth, t.nodes.c.length, t.nodes.c.segment)
#: Columns of a stored event the duplicate check reads.
EVENT_KEYS = sa.select(t.events.c.event_id, t.events.c.execution_id, t.events.c.seq, t.events.c.kind,
                       t.events.c.content_digest)
_POLICY_VERSION = sa.select(t.policy_versions.c.version).where(
    t.policy_versions.c.run_id == sa.bindparam("run_id"), t.policy_versions.c.version == sa.bindparam("version"))
_CELL = sa.select(t.cells).where(t.cells.c.cell_id == sa.bindparam("cell_id"))
_STORED_EVENT = sa.select(t.events).where(t.events.c.event_id == sa.bindparam("event_id"))


def node_record(r: Any) -> NodeRecord:
    """The planner's record of a :data:`NODE_FIELDS` row."""
    return NodeRecord(r.node_id, r.execution_id, r.parent_id, r.prev_segment_node, Role(r.role), r.depth, r.length,
                      r.segment)


def prior(r: Any) -> Prior:
    """The duplicate check's key of an :data:`EVENT_KEYS` row."""
    return (r.execution_id, r.seq, r.kind, bytes(r.content_digest) if r.content_digest is not None else None)


class SqlStoredState:
    """The planner's reads on ``conn``, in its transaction (portable SQL; subclasses specialise id look-ups)."""

    def __init__(self, conn: Connection, trees: TreeReader) -> None:
        self._conn = conn
        self._trees = trees

    @property
    def conn(self) -> Connection:
        return self._conn

    def db(self) -> Connection:
        """The connection, ready for a query (a subclass ends an open COPY first)."""
        return self._conn

    def prior_events(self, event_ids: Sequence[str]) -> dict[str, Prior]:
        c = t.events.c
        return {r.event_id: prior(r) for start in range(0, len(event_ids), 1000)
                for r in self.db().execute(EVENT_KEYS.where(c.event_id.in_(event_ids[start : start + 1000])))}

    def stored_event(self, event_id: str) -> Mapping[str, Any] | None:
        found = self.db().execute(_STORED_EVENT, {"event_id": event_id}).mappings().first()
        return dict(found) if found is not None else None

    def executions(self, execution_ids: Sequence[str]) -> dict[str, Row]:
        q = sa.select(t.executions).where(t.executions.c.execution_id.in_(execution_ids))
        return {row["execution_id"]: dict(row) for row in self.db().execute(q).mappings()}

    def nodes(self, node_ids: Sequence[str]) -> list[NodeRecord]:
        return [node_record(r) for r in self.db().execute(NODE_FIELDS.where(t.nodes.c.node_id.in_(node_ids)))]

    def children(self, execution_id: str, parent: str | None) -> list[ChildNode]:
        c = t.nodes.c
        cond = c.parent_id.is_(None) if parent is None else c.parent_id == parent
        q = (sa.select(c.node_id, c.span_digest, c.length).where(c.execution_id == execution_id, cond)
             .order_by(c.seq.desc()))
        return [(r.node_id, bytes(r.span_digest), r.length) for r in self.db().execute(q)]

    def path_tokens(self, node_id: str) -> TokenArray:
        return self._trees.context_tokens(self.db(), node_id)

    def stored_spans(self, digests: Iterable[bytes]) -> set[bytes]:
        return existing_digests(self.db(), digests)

    def policy_version_exists(self, run_id: str, version: int) -> bool:
        return self.db().execute(_POLICY_VERSION, {"run_id": run_id, "version": version}).first() is not None

    def cell(self, cell_id: str) -> Row | None:
        found = self.db().execute(_CELL, {"cell_id": cell_id}).mappings().first()
        return dict(found) if found is not None else None


class SqlApplier(ABC):
    """An :class:`~sapwood.platform.storage.applier.EventApplier` on ``conn``: a dialect's
    :meth:`stored_state`, span sink (:meth:`open_sink`, none by default) and :meth:`write`."""

    def __init__(self, conn: Connection, trees: TreeReader) -> None:
        self.conn = conn
        #: The dialect's tree reader (the planner's path look-ups).
        self.trees = trees

    def stored_state(self) -> SqlStoredState:
        """The planner's reads for one batch."""
        return SqlStoredState(self.conn, self.trees)

    def open_sink(self) -> SpanSink | None:
        """Where the batch's new spans stream while it is planned; None (the default): written at the end."""
        return None

    @abstractmethod
    def write(self, writes: PlannedWrites, timer: PhaseTimer) -> None:
        """Store ``writes`` in the transaction, crediting ``spans``, ``payloads`` and ``store`` to ``timer``."""


def insert_rows(conn: Connection, table_name: str, rows: list[Row]) -> None:
    """A multi-row ``INSERT`` of ``rows`` into the table ``table_name`` (nothing when empty)."""
    if rows:
        conn.execute(t.metadata.tables[table_name].insert(), rows)


def write_updates(conn: Connection, writes: PlannedWrites) -> None:
    """Update the nodes and executions stored before the batch, and write its cells."""
    _update_nodes(conn, writes.node_updates)
    _write_cells(conn, writes)
    if writes.touched_executions:
        cols = [c.name for c in t.executions.columns if c.name != "execution_id"]
        stmt = (
            t.executions.update()
            .where(t.executions.c.execution_id == sa.bindparam("_eid"))
            .values({c: sa.bindparam(c) for c in cols})
        )
        conn.execute(stmt, [{"_eid": r["execution_id"], **{c: r[c] for c in cols}} for r in writes.touched_executions])


def _update_nodes(conn: Connection, updates: dict[str, Row]) -> None:
    groups: dict[tuple[str, ...], list[Row]] = {}
    for nid, values in updates.items():
        groups.setdefault(tuple(sorted(values)), []).append({"_nid": nid, **values})
    for keys, rows in groups.items():
        stmt = (
            t.nodes.update()
            .where(t.nodes.c.node_id == sa.bindparam("_nid"))
            .values({k: sa.bindparam(k) for k in keys})
        )
        conn.execute(stmt, rows)


def _write_cells(conn: Connection, writes: PlannedWrites) -> None:
    """Insert the batch's cells (a touched existing cell is replaced: a handful of rows per batch)."""
    if writes.replaced_cells:
        conn.execute(t.cells.delete().where(t.cells.c.cell_id.in_(writes.replaced_cells)))
    insert_rows(conn, "cells", writes.cells)
    insert_rows(conn, "scheduler_decisions", writes.decisions)
    insert_rows(conn, "switch_phases", writes.phases)


__all__ = ["EVENT_KEYS", "NODE_FIELDS", "SqlApplier", "SqlStoredState", "insert_rows", "node_record", "prior",
           "write_updates"]
