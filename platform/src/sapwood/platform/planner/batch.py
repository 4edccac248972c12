"""The batch planner: validates each event of a batch in order and collects the rows it writes.

Each event is checked against the stored state plus the effects of the batch's earlier events (an
in-memory overlay): static validation, batch-wide array figures, per-execution order, then its
handler (:mod:`.handlers`), which looks everything up and verifies it before recording its nodes,
spans and rows — so a rejected event leaves no trace. Nothing here knows tables or dialects: reads
go through a :class:`~sapwood.platform.planner.ports.StoredState`, and :meth:`BatchPlanner.writes`
hands the result to an applier.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from sqlalchemy.engine import Connection

from sapwood.platform.events import Event
from sapwood.platform.planner.cells import CellEffects
from sapwood.platform.planner.executions import ExecutionLedger, count_node
from sapwood.platform.planner.handlers import Overrides, handler_for
from sapwood.platform.planner.ports import PlannedWrites, Row, SpanSink, StoredState
from sapwood.platform.planner.results import ContextCache, Hasher
from sapwood.platform.planner.span_effects import Refs, SpanEffects
from sapwood.platform.planner.tree_effects import TreeEffects
from sapwood.platform.replays import content_digest
from sapwood.platform.tokens import id_limit
from sapwood.platform.tree import NodeRecord, Role


class BatchPlanner:
    """Validated effects of a batch, not yet written.

    ``replay``: the events are stored already (a rebuild); only projections are planned. ``sink``:
    where new spans go as soon as their event is planned (else the applier writes them at the end).
    """

    def __init__(self, state: StoredState, cache: ContextCache | None, *, replay: bool,
                 sink: SpanSink | None = None) -> None:
        self.state = state
        self.replay = replay
        self.spans = SpanEffects(state, sink)
        self.tree = TreeEffects(state, self.spans, cache)
        self.executions = ExecutionLedger()
        self.cells = CellEffects(state)
        self.events: list[Row] = []
        self.calls: list[Row] = []
        self.segments: list[Row] = []
        self.scores: list[Row] = []
        self.policy_versions: list[Row] = []
        #: (run id, version) of the policies the batch publishes.
        self.policy_keys: set[tuple[str, int]] = set()

    @property
    def conn(self) -> Connection:
        """The connection the batch is planned in (the stored state's; the planner reads only through it)."""
        return self.state.conn

    def load(self, events: Sequence[Event]) -> None:
        """Load the stored executions (locked) and nodes ``events`` refer to."""
        self.executions.load(self.state, events)
        self.tree.load(events)

    def prepare_arrays(self, events: Sequence[Event]) -> None:
        """Batch-wide figures (and, when spans stream, digests and stored flags) of every array."""
        self.spans.prepare(events)

    # -- planning one event ---------------------------------------------------------------------------
    def plan(self, event: Event) -> None:
        """Validate ``event`` against the current state and add its effects, or raise.

        Every check runs before the first effect: each handler looks everything up and verifies it,
        then records the event's nodes, spans and rows, so a rejected event leaves no trace.
        """
        handler = handler_for(type(event))
        event.validate(numbers=False)
        self.check_numbers(event)
        st = self.executions.check_seq(event)
        self.check_vocab(event, st["vocab_size"] if st is not None else None)
        refs: Refs = {}
        overrides = handler(event, self, st, refs)
        if st is not None:
            st["last_seq"] = event.seq
        if not self.replay:
            self.events.append(self._event_row(event, refs, overrides))

    def check_numbers(self, event: Event) -> None:
        """:meth:`Event.check_numbers` through the batch's figures (the exact check on a doubt)."""
        for name, kind in event.arrays:
            if kind == "logprobs" and not self.spans.stats.logprobs_ok(getattr(event, name)):
                event.check_numbers()
                return

    def check_vocab(self, event: Event, vocab_size: int | None) -> None:
        """:meth:`Event.check_vocab` through the batch's figures (the exact check on a doubt)."""
        limit = id_limit(vocab_size)
        for name, kind in event.arrays:
            if kind == "tokens":
                arr = getattr(event, name)
                top = self.spans.stats.token_top(arr)
                if arr.size and (top is None or top >= limit):
                    event.check_vocab(vocab_size)
                    return

    # -- effects shared by handlers -------------------------------------------------------------------
    def add_node(self, event: Event, st: Row, refs: Refs, *, node_id: str, parent: NodeRecord | None, role: Role,
                 name: str, tokens: np.ndarray, state: Hasher, segment: int | None = None,
                 prev_segment_node: str | None = None, call_id: str | None = None,
                 policy_version: int | None = None) -> NodeRecord:
        """Record a node of ``tokens`` (see :meth:`TreeEffects.add`) and count it in execution row ``st``."""
        node = self.tree.add(event, st["execution_id"], refs, node_id=node_id, parent=parent, role=role, name=name,
                             tokens=tokens, state=state, segment=segment, prev_segment_node=prev_segment_node,
                             call_id=call_id, policy_version=policy_version)
        count_node(st, node.length)
        return node

    def _event_row(self, event: Event, refs: Refs, overrides: Overrides) -> Row:
        """The stored event: envelope columns, and a body of its scalar fields (with ``overrides``) and its
        arrays as [span digest hex, count] (``refs``: every handler notes each array of its event there).
        Fields at their defaults are left out of the body, as on the wire: a rebuild reads them as the defaults."""
        body = event.wire_scalar_fields()
        if overrides:
            body.update(overrides)
        assert len(refs) == len(event.arrays), f"{event.kind}: arrays {sorted(refs)} noted, {event.arrays} declared"
        body["arrays"] = refs
        return {
            "event_id": event.event_id,
            "execution_id": event.execution_id,
            "seq": event.seq,
            "kind": event.kind,
            "schema_version": event.schema_version,
            "created_at": event.created_at,
            "body": body,
            "content_digest": content_digest(event, self.spans.digest_of),
        }

    # -- the plan ---------------------------------------------------------------------------------------
    def writes(self) -> PlannedWrites:
        """Everything the batch planned, for an applier to write."""
        cells = self.cells
        return PlannedWrites(
            replay=self.replay,
            events=self.events,
            new_executions=self.executions.new_rows(),
            touched_executions=self.executions.touched_rows(),
            nodes=list(self.tree.new_rows.values()),
            node_updates=self.tree.updates,
            calls=self.calls,
            segments=self.segments,
            scores=self.scores,
            policy_versions=self.policy_versions,
            spans=self.spans.spans,
            cells=cells.dirty_rows(),
            replaced_cells=cells.replaced(),
            decisions=cells.decisions,
            phases=cells.phases,
        )

    def new_states(self) -> dict[str, Hasher]:
        """Prefix states of the nodes created; merge into the cache only after commit."""
        return self.tree.new_states()


__all__ = ["BatchPlanner"]
