"""The PostgreSQL event applier: look-ups by one ``uuid[]`` literal, spans streamed while planning, COPY writes.

* Reads: a batch's events and nodes are looked up with one ``uuid[]`` literal each (no bind per
  id); its executions are locked ``FOR UPDATE``, so concurrent writers of one execution serialise.
* Spans: a binary ``COPY spans`` stays open on the batch's connection while its events are planned
  (:class:`~sapwood.platform.storage.postgres.span_stream.SpanStream`); each accepted event's new spans go out at
  once and the server stores them while Python plans the next events. A look-up the planner needs
  mid-batch ends the COPY first (:meth:`PostgresStoredState.db`); the next span opens another.
* Rows: each table with at least :data:`~sapwood.platform.storage.postgres.bulkcopy.COPY_MIN_ROWS` rows goes in
  one text-format COPY, built while the server stores the previous one
  (:func:`~sapwood.platform.storage.postgres.bulkcopy.send_overlapped`); smaller ones in a multi-row ``INSERT``.

Everything stays in the caller's transaction: a failing batch takes the streamed spans with it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from sapwood.platform import schema as t
from sapwood.platform.phase_timer import PhaseTimer
from sapwood.platform.planner.ports import PlannedWrites, Row
from sapwood.platform.replays import Prior
from sapwood.platform.storage.applier_sql import (
    EVENT_KEYS,
    NODE_FIELDS,
    SqlApplier,
    SqlStoredState,
    insert_rows,
    node_record,
    prior,
    write_updates,
)
from sapwood.platform.storage.postgres.bulkcopy import (
    COPY_MIN_ROWS,
    Payload,
    send_overlapped,
    spans_payload,
    text_payload,
)
from sapwood.platform.storage.postgres.span_stream import SpanStream
from sapwood.platform.storage.postgres.spans import new_span_rows
from sapwood.platform.storage.postgres.uuids import uuid_array_literal, uuid_in
from sapwood.platform.storage.trees import TreeReader
from sapwood.platform.tree import NodeRecord

# Look-ups every batch runs, built once (the ids go as one uuid[] literal).
_NODES_BY_ID = NODE_FIELDS.where(uuid_in(t.nodes.c.node_id, "ids"))
_EVENTS_BY_ID = EVENT_KEYS.where(uuid_in(t.events.c.event_id, "ids"))


class PostgresStoredState(SqlStoredState):
    """The planner's reads on PostgreSQL; every query first ends the batch's open span COPY, if any."""

    def __init__(self, conn: Connection, trees: TreeReader) -> None:
        super().__init__(conn, trees)
        #: The batch's span stream once opened (queries pause it).
        self.stream: SpanStream | None = None

    def db(self) -> Connection:
        if self.stream is not None:
            self.stream.pause()
        return self._conn

    def prior_events(self, event_ids: Sequence[str]) -> dict[str, Prior]:
        return {r.event_id: prior(r) for r in self.db().execute(_EVENTS_BY_ID, {"ids": uuid_array_literal(event_ids)})}

    def executions(self, execution_ids: Sequence[str]) -> dict[str, Row]:
        q = sa.select(t.executions).where(t.executions.c.execution_id.in_(execution_ids)).with_for_update()
        return {row["execution_id"]: dict(row) for row in self.db().execute(q).mappings()}

    def nodes(self, node_ids: Sequence[str]) -> list[NodeRecord]:
        return [node_record(r) for r in self.db().execute(_NODES_BY_ID, {"ids": uuid_array_literal(node_ids)})]


class PostgresApplier(SqlApplier):
    """:class:`~sapwood.platform.storage.applier.EventApplier` on a PostgreSQL (psycopg 3) connection."""

    def __init__(self, conn: Connection, trees: TreeReader) -> None:
        super().__init__(conn, trees)
        self._state = PostgresStoredState(conn, trees)

    def stored_state(self) -> PostgresStoredState:
        self._state = PostgresStoredState(self.conn, self.trees)
        return self._state

    def open_sink(self) -> SpanStream:
        stream = self._state.stream = SpanStream(self.conn)
        return stream

    def write(self, writes: PlannedWrites, timer: PhaseTimer) -> None:
        """Store the plan: the stream's last spans, then one COPY (or INSERT) per table, then the updates."""
        conn = self.conn
        stream = self._state.stream
        span_rows = new_span_rows(conn, writes.spans) if stream is None and not writes.replay and writes.spans else []
        timer.lap("spans")
        planned_stream_s = stream.seconds if stream is not None else 0.0
        builders: list[Callable[[], Payload]] = [functools.partial(spans_payload, span_rows)] if span_rows else []
        small: list[tuple[str, list[Row]]] = []
        for table, rows in writes.inserts():
            if len(rows) >= COPY_MIN_ROWS:
                builders.append(functools.partial(text_payload, t.metadata.tables[table], rows))
            elif rows:
                small.append((table, rows))
        if stream is not None:
            # Its last rows still go out and are stored while the first table's payload is built.
            stream.flush()
        building = send_overlapped(conn, builders, finish_previous=stream.close if stream is not None else None)
        for table, rows in small:
            insert_rows(conn, table, rows)
        write_updates(conn, writes)
        flushed_s = stream.seconds - planned_stream_s if stream is not None else 0.0
        timer.add("spans", stream.seconds if stream is not None else 0.0)
        timer.add("payloads", building)
        timer.lap("store", exclude=flushed_s + building)


__all__ = ["PostgresApplier", "PostgresStoredState"]
