"""Apply: the one function that turns TITO events into stored state.

Both the Kafka ingest and the in-process transport call :func:`apply_events` inside a
database transaction. It is idempotent (an event id already stored is skipped), checks the
per-execution order, verifies every model call's input digest against the input
reconstructed from the tree, and writes the events, their spans and every projection in
the caller's transaction — so either the whole batch lands or nothing does.

Work is split in two phases: *plan* validates each event against the stored state plus the
effects of the batch's earlier events (an in-memory overlay), *write* bulk-inserts the rows.
On PostgreSQL the two overlap: new spans stream to the server while later events are still
being planned (:mod:`sapwood.platform.span_stream`), and each table's COPY data is built while
the server stores the previous table's.
In ``strict`` mode the first invalid event raises and nothing is written; otherwise invalid
events are returned as :class:`Rejected` (for the dead letters) and the rest are applied.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from sapwood.platform import schema as t
from sapwood.platform.array_stats import ArrayStats, batch_stats
from sapwood.platform.bulkcopy import COPY_MIN_ROWS, Payload, send_overlapped, spans_payload, text_payload
from sapwood.platform.cells_apply import CELL_HANDLERS, write_cells
from sapwood.platform.errors import (
    ConflictError,
    DigestMismatchError,
    SapwoodError,
    SequenceError,
    UnknownParentError,
    ValidationError,
)
from sapwood.platform.events import (
    Event,
    ExecutionFinished,
    ExecutionStarted,
    Fork,
    ModelCall,
    Observation,
    PartialScore,
    PolicyPublished,
    Prompt,
    SegmentBoundary,
)
from sapwood.platform.replays import Prior, content_digest, replay_conflict, same_batch_conflict
from sapwood.platform.span_stream import SpanStream
from sapwood.platform.spans import existing_digests, insert_span_rows, new_span_rows, path_tokens, uuid_in
from sapwood.platform.tokens import digest_bytes, id_limit, input_hasher, pack
from sapwood.platform.tree import ROLE_NAMES, Role, logical_parent, match_prefix
from sapwood.platform.uuids import uuid_array_literal

Hasher = Any  # hashlib.blake2b object

# Look-ups every batch runs, built once (PostgreSQL: the ids go as one uuid[] literal).
_NODE_FIELDS = sa.select(t.nodes.c.node_id, t.nodes.c.execution_id, t.nodes.c.role, t.nodes.c.depth, t.nodes.c.length,
                         t.nodes.c.segment)
_NODES_BY_ID_PG = _NODE_FIELDS.where(uuid_in(t.nodes.c.node_id, "ids"))
_EVENT_KEYS = sa.select(t.events.c.event_id, t.events.c.execution_id, t.events.c.seq, t.events.c.kind,
                        t.events.c.content_digest)
_EVENTS_BY_ID_PG = _EVENT_KEYS.where(uuid_in(t.events.c.event_id, "ids"))


class ContextCache:
    """LRU of prefix hash states: node id → BLAKE2b state after the node's last token.

    A model call's input digest is then checked in O(appended tokens); a miss rebuilds the
    node's path from the store once. Nodes are immutable, so entries never go stale.
    """

    def __init__(self, max_nodes: int = 200_000) -> None:
        self.max_nodes = max_nodes
        self._states: OrderedDict[str, Hasher] = OrderedDict()

    def get(self, node_id: str) -> Hasher | None:
        state = self._states.get(node_id)
        if state is not None:
            self._states.move_to_end(node_id)
        return state

    def merge(self, states: dict[str, Hasher]) -> None:
        """Add states of nodes whose transaction committed."""
        self._states.update(states)
        while len(self._states) > self.max_nodes:
            self._states.popitem(last=False)

    def __len__(self) -> int:
        return len(self._states)


@dataclass
class Rejected:
    """An event that could not be applied, with the reason."""

    event: Event
    error: SapwoodError


@dataclass
class ApplyResult:
    """Outcome of one :func:`apply_events` call."""

    applied: list[Event] = field(default_factory=list)
    duplicates: int = 0
    rejected: list[Rejected] = field(default_factory=list)
    tokens: int = 0
    #: Prefix states of the nodes created; merge into the cache only after commit.
    new_states: dict[str, Hasher] = field(default_factory=dict)
    #: Seconds spent per phase: ``lookups`` (duplicates, stored state), ``digests`` (content
    #: addresses of the batch's arrays and which are stored already), ``plan`` (validation and tree
    #: bookkeeping in Python), ``spans`` (new spans narrowed, framed and sent), ``payloads`` (COPY
    #: data of the other tables built), ``store`` (waiting for the database to write rows).
    timings: dict[str, float] = field(default_factory=dict)


_NODE_ATTRS: dict[type[Event], tuple[tuple[str, ...], tuple[str, ...]]] = {}


def _node_attrs(cls: type[Event]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Attributes of ``cls`` naming the nodes its events create, and those naming nodes they refer to
    (computed once per class)."""
    attrs = _NODE_ATTRS.get(cls)
    if attrs is None:
        field_names = {f.name for f in dataclasses.fields(cls)}
        attrs = _NODE_ATTRS[cls] = (
            tuple(n for n in ("node_id", "input_node_id", "output_node_id", "root_node_id") if hasattr(cls, n)),
            tuple(n for n in ("parent", "at_node", "from_node") if n in field_names),
        )
    return attrs


@dataclass(slots=True)
class _Node:
    node_id: str
    execution_id: str
    role: int
    depth: int
    length: int
    segment: int

    @property
    def end(self) -> int:
        return self.depth + self.length


#: Node values set on a parent when a child is added.
_NOT_A_LEAF = {"is_leaf": False}

_EXEC_COUNTERS = ("n_nodes", "n_tokens", "n_input_tokens", "n_output_tokens", "n_calls", "n_forks")


class _Plan:
    """Validated effects of a batch, not yet written."""

    def __init__(
        self, conn: Connection, cache: ContextCache | None, *, replay: bool, stream: SpanStream | None = None
    ) -> None:
        self.conn = conn
        self.cache = cache
        self.replay = replay
        #: Where new spans go as soon as their event is planned (PostgreSQL); else written at the end.
        self.stream = stream
        #: digest → whether the store already holds that span (before this batch).
        self.span_stored: dict[bytes, bool] = {}
        #: Batch-wide array figures (and digests) from :meth:`prepare_arrays` (empty until then).
        self.stats = ArrayStats()
        self.execs: dict[str, dict[str, Any]] = {}
        self.new_execs: set[str] = set()
        self.nodes: dict[str, _Node] = {}
        self.new_nodes: dict[str, dict[str, Any]] = {}
        self.node_updates: dict[str, dict[str, Any]] = {}
        self.children_new: dict[str | None, list[str]] = {}
        #: digest → canonical span array (int32 ids [n] or float32 log-probs [n]) to store.
        self.spans: dict[bytes, np.ndarray] = {}
        #: node ids created by events of this batch (never looked up in the store).
        self.batch_node_ids: set[str] = set()
        self.states: dict[str, Hasher] = {}
        self.rows: dict[str, list[dict[str, Any]]] = {
            "events": [],
            "calls": [],
            "segments": [],
            "scores": [],
            "policy_versions": [],
        }
        self.policy_keys: set[tuple[str, int]] = set()

    # -- loading ---------------------------------------------------------------------------------------
    def load(self, events: Sequence[Event]) -> None:
        exec_ids = sorted({e.execution_id for e in events if e.execution_id})
        if exec_ids:
            q = sa.select(t.executions).where(t.executions.c.execution_id.in_(exec_ids))
            if self.conn.dialect.name == "postgresql":
                q = q.with_for_update()
            for row in self.conn.execute(q).mappings():
                self.execs[row["execution_id"]] = dict(row)
        created: set[str] = set()
        for e in events:
            for name in _node_attrs(type(e))[0]:
                ref = getattr(e, name)
                if ref:
                    created.add(ref)
        refs: set[str] = set()
        for e in events:
            for name in _node_attrs(type(e))[1]:
                ref = getattr(e, name)
                if ref and ref not in created:
                    refs.add(ref)
        self.batch_node_ids = created
        self._load_nodes(refs)

    def prepare_arrays(self, events: Sequence[Event], *, spans: bool) -> None:
        """Check figures of every array of ``events`` in a few vectorized passes; with ``spans``, also
        digest every array and look up which spans are stored already."""
        arrays = [arr for e in events for arr in e.array_fields().values() if arr.size]
        self.stats = batch_stats(arrays, digests=spans)
        if not spans:
            return
        wanted = {d for _, d in self.stats.digests.values()}
        stored = existing_digests(self.conn, wanted)
        self.span_stored = {d: d in stored for d in wanted}

    def digest_of(self, arr: np.ndarray) -> bytes:
        """Content address of a contiguous canonical array (from :meth:`prepare_arrays` when known)."""
        known = self.stats.digest(arr)
        return known if known is not None else digest_bytes(arr.data)

    def db(self) -> Connection:
        """The connection, ready for a query (an open span COPY is ended first)."""
        if self.stream is not None:
            self.stream.pause()
        return self.conn

    def _span_stored(self, digest: bytes) -> bool:
        stored = self.span_stored.get(digest)
        if stored is None:
            stored = self.span_stored[digest] = bool(existing_digests(self.db(), [digest]))
        return stored

    def _load_nodes(self, node_ids: Iterable[str]) -> None:
        wanted = [n for n in node_ids if n not in self.nodes]
        if not wanted:
            return
        if self.conn.dialect.name == "postgresql":
            rows = self.db().execute(_NODES_BY_ID_PG, {"ids": uuid_array_literal(wanted)})
        else:
            rows = self.db().execute(_NODE_FIELDS.where(t.nodes.c.node_id.in_(wanted)))
        for r in rows:
            self.nodes[r.node_id] = _Node(r.node_id, r.execution_id, r.role, r.depth, r.length, r.segment)

    # -- helpers ---------------------------------------------------------------------------------------
    def node(self, node_id: str, execution_id: str, what: str) -> _Node:
        node = self.nodes.get(node_id)
        if node is None and node_id not in self.batch_node_ids:
            self._load_nodes([node_id])
            node = self.nodes.get(node_id)
        if node is None or node.execution_id != execution_id:
            raise UnknownParentError(
                f"{what} {node_id} is not a node of execution {execution_id}; expected the id of a node "
                "created by an earlier event of the same execution"
            )
        return node

    def state(self, node_id: str) -> Hasher:
        """Hash state of the full context ending at ``node_id``."""
        state = self.states.get(node_id)
        if state is None and self.cache is not None:
            state = self.cache.get(node_id)
        if state is None:
            state = input_hasher()
            state.update(pack(path_tokens(self.db(), node_id)))
            self.states[node_id] = state
        return state

    def child_state(self, parent: str | None, data: bytes | memoryview) -> Hasher:
        state = input_hasher() if parent is None else self.state(parent).copy()
        state.update(data)
        return state

    def exec_state(self, event: Event) -> dict[str, Any]:
        assert event.execution_id is not None
        st = self.execs.get(event.execution_id)
        if st is None:
            raise UnknownParentError(
                f"{event.kind} for unknown execution {event.execution_id}; expected an execution_started "
                "event (seq 0) first",
                event_id=event.event_id,
            )
        return st

    def check_seq(self, event: Event) -> dict[str, Any] | None:
        """Per-execution order: seq must be exactly last_seq + 1."""
        if not event.execution_scoped:
            return None
        if isinstance(event, ExecutionStarted):
            if event.execution_id in self.execs:
                raise ConflictError(
                    f"execution {event.execution_id} was already started by another event; "
                    f"event {event.event_id} reuses its id"
                )
            return None
        st = self.exec_state(event)
        expected = st["last_seq"] + 1
        if event.seq != expected:
            kind = "gap" if (event.seq or 0) > expected else "reuse"
            raise SequenceError(
                f"sequence {kind} in execution {event.execution_id}: got seq {event.seq}, expected {expected}",
                event_id=event.event_id,
            )
        if st["status"] != "running" and not isinstance(event, PartialScore):
            raise SequenceError(
                f"{event.kind} after execution {event.execution_id} finished ({st['status']}); only "
                "partial_score events may follow execution_finished",
                event_id=event.event_id,
            )
        return st

    # -- planning one event ---------------------------------------------------------------------------
    def plan(self, event: Event) -> None:
        """Validate ``event`` against the current state and add its effects, or raise.

        Every check runs before the first effect: each handler looks everything up and verifies it,
        then records the event's nodes, spans and rows, so a rejected event leaves no trace.
        """
        event.validate(numbers=False)
        self.check_numbers(event)
        st = self.check_seq(event)
        self.check_vocab(event, st["vocab_size"] if st is not None else None)
        refs: dict[str, list[Any]] = {}
        overrides = _HANDLERS[type(event)](self, event, st, refs)
        if st is not None:
            st["last_seq"] = event.seq
        if not self.replay:
            self.rows["events"].append(_event_row(event, refs, overrides, self.digest_of))

    def check_numbers(self, event: Event) -> None:
        """:meth:`Event.check_numbers` through the batch's figures (the exact check on a doubt)."""
        for name, kind in event.arrays:
            if kind == "logprobs" and not self.stats.logprobs_ok(getattr(event, name)):
                event.check_numbers()
                return

    def check_vocab(self, event: Event, vocab_size: int | None) -> None:
        """:meth:`Event.check_vocab` through the batch's figures (the exact check on a doubt)."""
        limit = id_limit(vocab_size)
        for name, kind in event.arrays:
            if kind == "tokens":
                arr = getattr(event, name)
                top = self.stats.token_top(arr)
                if arr.size and (top is None or top >= limit):
                    event.check_vocab(vocab_size)
                    return

    def check_new_node(self, node_id: str, event: Event) -> None:
        """Refuse a node id the store or the batch already has."""
        if node_id in self.nodes:
            raise ConflictError(f"node {node_id} already exists (event {event.event_id} reuses its id)")

    # -- effects (called only once every check of the event has passed) ------------------------------
    def add_span(self, refs: dict[str, list[Any]], name: str, arr: np.ndarray) -> bytes | None:
        """Store ``arr`` (the event's array ``name``) as a span unless the batch has it; note its reference
        in ``refs``. Returns its digest (None when empty)."""
        if arr.size == 0:
            refs[name] = [None, 0]
            return None
        arr = np.ascontiguousarray(arr)
        digest = self.digest_of(arr)
        refs[name] = [digest.hex(), int(arr.size)]
        if digest not in self.spans:
            self.spans[digest] = arr
            if self.stream is not None and not self._span_stored(digest):
                self.stream.add(digest, arr, bits=self.stats.token_bits(arr))
        return digest

    def add_node(self, event: Event, st: dict[str, Any], refs: dict[str, list[Any]], *, node_id: str,
                 parent: _Node | None, role: int, name: str, tokens: np.ndarray, state: Hasher,
                 segment: int | None = None, prev_segment_node: str | None = None, call_id: str | None = None,
                 policy_version: int | None = None) -> _Node:
        """Record a node of ``tokens`` (the event's array ``name``) under ``parent``; ``state``: the context
        hash after its last token. ``node_id`` was checked with :meth:`check_new_node`."""
        digest = self.add_span(refs, name, tokens)
        assert digest is not None
        length = int(tokens.size)
        parent_id = parent.node_id if parent is not None else None
        node = _Node(node_id, st["execution_id"], role, parent.end if parent is not None else 0, length,
                     segment if segment is not None else (parent.segment if parent is not None else 0))
        self.new_nodes[node_id] = {
            "node_id": node_id,
            "execution_id": node.execution_id,
            "parent_id": parent_id,
            "prev_segment_node": prev_segment_node,
            "role": role,
            "span_digest": digest,
            "length": length,
            "depth": node.depth,
            "segment": node.segment,
            "is_leaf": True,
            "fork_branches": 0,
            "call_id": call_id,
            "policy_version": policy_version,
            "seq": event.seq,
        }
        self.nodes[node_id] = node
        self.children_new.setdefault(parent_id, []).append(node_id)
        self.states[node_id] = state
        before = logical_parent(parent_id, prev_segment_node)
        if before:
            self.update_node(before, _NOT_A_LEAF)
        st["n_nodes"] += 1
        st["n_tokens"] += length
        return node

    def update_node(self, node_id: str, values: dict[str, Any]) -> None:
        """Set ``values`` on a node: in its row when this batch created it, else as an UPDATE after the COPYs."""
        row = self.new_nodes.get(node_id)
        if row is not None:
            row.update(values)
        else:
            self.node_updates.setdefault(node_id, {}).update(values)

    # -- full-input matching -----------------------------------------------------------------------
    def match_whole_nodes(self, execution_id: str, tokens: np.ndarray) -> tuple[str | None, int]:
        """Longest chain of existing whole nodes that prefixes ``tokens``: (last node, tokens matched).

        The rule is :func:`sapwood.platform.tree.match_prefix`; here children come from the store
        and this batch's new nodes, compared by span digest.
        """
        digests: dict[str, bytes] = {}

        def children(parent: str | None) -> list[tuple[str, int]]:
            kids = self._children(execution_id, parent)
            digests.update((nid, digest) for nid, digest, _ in kids)
            return [(nid, length) for nid, _, length in kids]

        def matches(node_id: str, offset: int, length: int) -> bool:
            return digests[node_id] == digest_bytes(pack(tokens[offset : offset + length]))

        return match_prefix(children, matches, int(tokens.size))

    def _children(self, execution_id: str, parent: str | None) -> list[tuple[str, bytes, int]]:
        """(node id, span digest, length) of ``parent``'s children (None: the context roots), most recent first."""
        c = t.nodes.c
        cond = c.parent_id.is_(None) if parent is None else c.parent_id == parent
        q = (sa.select(c.node_id, c.span_digest, c.length).where(c.execution_id == execution_id, cond)
             .order_by(c.seq.desc()))
        out = [(r.node_id, bytes(r.span_digest), r.length) for r in self.db().execute(q)]
        for nid in self.children_new.get(parent, []):
            row = self.new_nodes[nid]
            if row["execution_id"] == execution_id:
                out.insert(0, (nid, row["span_digest"], row["length"]))
        return out


#: A handler checks one event, then records its effects; returns overrides of the stored event body.
_Overrides = dict[str, Any] | None


def _h_started(plan: _Plan, e: ExecutionStarted, st: None, refs: dict[str, list[Any]]) -> _Overrides:
    assert e.execution_id is not None
    plan.execs[e.execution_id] = {
        "execution_id": e.execution_id,
        "run_id": e.run_id,
        "task_id": e.task_id,
        "task_family": e.task_family,
        "engine": e.engine,
        "sampling_params": e.sampling_params,
        "vocab_size": e.vocab_size,
        "metadata": e.metadata,
        "status": "running",
        "reward": None,
        "leaf_rewards": {},
        "message": "",
        "started_at": e.created_at,
        "finished_at": None,
        "last_seq": 0,
        "n_segments": 1,
        "max_policy_version": None,
        "score": None,
        "score_revision": None,
        **dict.fromkeys(_EXEC_COUNTERS, 0),
    }
    plan.new_execs.add(e.execution_id)
    return None


def _root_state(tokens: np.ndarray) -> Hasher:
    state = input_hasher()
    state.update(np.ascontiguousarray(tokens).data)
    return state


def _h_prompt(plan: _Plan, e: Prompt, st: dict[str, Any], refs: dict[str, list[Any]]) -> _Overrides:
    assert e.execution_id is not None
    parent = plan.node(e.parent, e.execution_id, "prompt parent") if e.parent else None
    plan.check_new_node(e.node_id, e)
    tokens = np.ascontiguousarray(e.token_ids)
    state = plan.child_state(parent.node_id, tokens.data) if parent is not None else _root_state(tokens)
    plan.add_node(e, st, refs, node_id=e.node_id, parent=parent, role=Role.PROMPT, name="token_ids",
                  tokens=tokens, state=state)
    return None


def _h_observation(plan: _Plan, e: Observation, st: dict[str, Any], refs: dict[str, list[Any]]) -> _Overrides:
    assert e.execution_id is not None
    parent = plan.node(e.parent, e.execution_id, "observation parent")
    plan.check_new_node(e.node_id, e)
    tokens = np.ascontiguousarray(e.token_ids)
    plan.add_node(e, st, refs, node_id=e.node_id, parent=parent, role=Role.OBSERVATION, name="token_ids",
                  tokens=tokens, state=plan.child_state(parent.node_id, tokens.data))
    return None


def _h_call(plan: _Plan, e: ModelCall, st: dict[str, Any], refs: dict[str, list[Any]]) -> _Overrides:
    exec_id = e.execution_id
    assert exec_id is not None
    appended = e.appended
    event_input_id, output_id = e.input_node_id, e.output_node_id
    if e.parent is not None:
        parent: _Node | None = plan.node(e.parent, exec_id, "model_call parent")
        full_len = (parent.end if parent else 0) + int(appended.size)
        state = plan.child_state(e.parent, np.ascontiguousarray(appended).data)
        input_node_id = event_input_id
    else:
        # Full input: verify directly, then share whatever whole nodes already exist.
        state = _root_state(appended)
        full_len = int(appended.size)
        matched, offset = plan.match_whole_nodes(exec_id, appended)
        parent = plan.nodes[matched] if matched else None
        appended = appended[offset:]
        input_node_id = event_input_id if appended.size else matched
    digest = state.hexdigest()
    if digest != e.input_digest:
        raise DigestMismatchError(
            f"model_call {e.event_id}: input digest {e.input_digest} does not match the input "
            f"reconstructed from the tree ({digest}, {full_len} tokens); expected the BLAKE2b-128 of "
            "the exact input ids",
            event_id=e.event_id,
        )
    if appended.size:
        plan.check_new_node(event_input_id or "", e)
    plan.check_new_node(output_id, e)
    # -- effects
    if appended.size:
        input_parent = plan.add_node(e, st, refs, node_id=event_input_id or "", parent=parent, role=Role.PROMPT,
                                     name="appended", tokens=appended, state=state)
    else:
        refs["appended"] = [None, 0]
        assert parent is not None
        input_parent = parent
    output = np.ascontiguousarray(e.output_ids)
    out_state = state.copy()
    out_state.update(output.data)
    plan.add_node(e, st, refs, node_id=output_id, parent=input_parent,
                  role=Role.SUMMARY if e.call_kind == "summary" else Role.ACTION, name="output_ids",
                  tokens=output, state=out_state, call_id=e.event_id, policy_version=e.policy_version)
    lp_digest = plan.add_span(refs, "output_logprobs", e.output_logprobs)
    plan.rows["calls"].append({
        "call_id": e.event_id,
        "execution_id": exec_id,
        "seq": e.seq,
        "call_kind": e.call_kind,
        "segment": input_parent.segment,
        "input_node": input_node_id or input_parent.node_id,
        "input_len": full_len,
        "input_digest": e.input_digest,
        "output_node": output_id,
        "n_output": int(output.size),
        "logprobs_digest": lp_digest,
        "policy_version": e.policy_version,
        "finish_reason": e.finish_reason,
        "timings": e.timings,
        "sampling_params": e.sampling_params,
        "created_at": e.created_at,
    })
    st["n_calls"] += 1
    st["n_input_tokens"] += full_len
    st["n_output_tokens"] += int(output.size)
    mpv = st["max_policy_version"]
    st["max_policy_version"] = e.policy_version if mpv is None else max(mpv, e.policy_version)
    # Stored normalized when the full input was sent: the matched node as parent, only the rest as tokens.
    return {"parent": parent.node_id if parent else None} if e.parent is None else None


def _h_fork(plan: _Plan, e: Fork, st: dict[str, Any], refs: dict[str, list[Any]]) -> _Overrides:
    assert e.execution_id is not None
    plan.node(e.at_node, e.execution_id, "fork point")
    plan.update_node(e.at_node, {"fork_branches": e.branches})
    st["n_forks"] += 1
    return None


def _h_segment(plan: _Plan, e: SegmentBoundary, st: dict[str, Any], refs: dict[str, list[Any]]) -> _Overrides:
    assert e.execution_id is not None
    src = plan.node(e.from_node, e.execution_id, "segment_boundary.from_node")
    if src.role != Role.SUMMARY:
        raise ValidationError(
            f"segment_boundary.from_node {e.from_node} is a {ROLE_NAMES[src.role]} node; expected the "
            "output node of a summary call",
            event_id=e.event_id,
        )
    plan.check_new_node(e.root_node_id, e)
    segment = src.segment + 1
    tokens = np.ascontiguousarray(e.token_ids)
    plan.add_node(e, st, refs, node_id=e.root_node_id, parent=None, role=Role.PROMPT, name="token_ids",
                  tokens=tokens, state=_root_state(tokens), segment=segment, prev_segment_node=e.from_node)
    plan.rows["segments"].append({"root_node": e.root_node_id, "execution_id": e.execution_id,
                                  "segment": segment, "from_node": e.from_node, "seq": e.seq})
    st["n_segments"] = max(st["n_segments"], segment + 1)
    return None


def _h_finished(plan: _Plan, e: ExecutionFinished, st: dict[str, Any], refs: dict[str, list[Any]]) -> _Overrides:
    assert e.execution_id is not None
    for node_id in e.leaf_rewards:
        plan.node(node_id, e.execution_id, "leaf_rewards key")
    st.update(status=e.status, reward=e.reward, leaf_rewards=dict(e.leaf_rewards), message=e.message,
              finished_at=e.created_at)
    return None


def _h_score(plan: _Plan, e: PartialScore, st: dict[str, Any], refs: dict[str, list[Any]]) -> _Overrides:
    expected = 0 if st["score_revision"] is None else st["score_revision"] + 1
    if e.revision != expected:
        raise SequenceError(
            f"partial_score revision {e.revision} for execution {e.execution_id}; expected {expected}",
            event_id=e.event_id,
        )
    plan.rows["scores"].append({"event_id": e.event_id, "execution_id": e.execution_id, "revision": e.revision,
                                "score": float(e.score), "components": e.components, "scorer": e.scorer,
                                "note": e.note, "created_at": e.created_at})
    st.update(score=float(e.score), score_revision=e.revision)
    return None


def _h_policy(plan: _Plan, e: PolicyPublished, st: None, refs: dict[str, list[Any]]) -> _Overrides:
    key = (e.run_id, e.version)
    exists = key in plan.policy_keys or plan.db().execute(
        sa.select(t.policy_versions.c.version).where(
            t.policy_versions.c.run_id == e.run_id, t.policy_versions.c.version == e.version
        )
    ).first()
    if exists:
        raise ConflictError(f"policy version {e.version} of run {e.run_id} was already published")
    plan.policy_keys.add(key)
    plan.rows["policy_versions"].append({"run_id": e.run_id, "version": e.version, "event_id": e.event_id,
                                         "checkpoint": e.checkpoint, "metadata": e.metadata,
                                         "published_at": e.created_at})
    return None


_HANDLERS: dict[type[Event], Any] = {
    ExecutionStarted: _h_started,
    Prompt: _h_prompt,
    Observation: _h_observation,
    ModelCall: _h_call,
    Fork: _h_fork,
    SegmentBoundary: _h_segment,
    ExecutionFinished: _h_finished,
    PartialScore: _h_score,
    PolicyPublished: _h_policy,
    **CELL_HANDLERS,
}


def _event_row(event: Event, refs: dict[str, list[Any]], overrides: dict[str, Any] | None,
               digest_of: Callable[[np.ndarray], bytes] | None = None) -> dict[str, Any]:
    """The stored event: envelope columns, and a body of its scalar fields (with ``overrides``) and its arrays
    as [span digest hex, count] (``refs``: every handler notes each array of its event there)."""
    body = event.scalar_fields()
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
        "content_digest": content_digest(event, digest_of),
    }


def _find_duplicates(conn: Connection, events: Sequence[Event]) -> dict[str, Prior]:
    ids = [e.event_id for e in events]
    found: dict[str, Prior] = {}
    if conn.dialect.name == "postgresql":
        rows: Iterable[Any] = conn.execute(_EVENTS_BY_ID_PG, {"ids": uuid_array_literal(ids)})
    else:
        rows = (r for start in range(0, len(ids), 1000)
                for r in conn.execute(_EVENT_KEYS.where(t.events.c.event_id.in_(ids[start : start + 1000]))))
    for r in rows:
        found[r.event_id] = (r.execution_id, r.seq, r.kind,
                             bytes(r.content_digest) if r.content_digest is not None else None)
    return found


def apply_events(
    conn: Connection,
    events: Sequence[Event],
    *,
    cache: ContextCache | None = None,
    strict: bool = True,
    replay: bool = False,
) -> ApplyResult:
    """Validate and apply ``events`` (in order) inside the caller's transaction on ``conn``.

    ``strict``: raise on the first invalid event (nothing written); otherwise collect invalid
    events in ``ApplyResult.rejected`` and apply the others. ``replay``: re-derive projections
    from events already stored (no event/span writes, no duplicate check) — used by rebuilds.
    The caller merges ``result.new_states`` into ``cache`` after its transaction commits.
    """
    result = ApplyResult()
    if not events:
        return result
    for ev in events:
        if not isinstance(ev, Event):
            raise ValidationError(f"apply_events expects Event objects, got {type(ev).__name__}")
    todo: list[Event] = list(events)
    clock = time.perf_counter()
    if not replay:
        existing = _find_duplicates(conn, todo)
        seen: dict[str, Event] = {}
        fresh: list[Event] = []
        for ev in todo:
            prior = existing.get(ev.event_id)
            first = seen.get(ev.event_id)
            if prior is None and first is None:
                seen[ev.event_id] = ev
                fresh.append(ev)
                continue
            if prior is not None:
                same_keys = (prior[0], prior[1], prior[2]) == (ev.execution_id, ev.seq, ev.kind)
                conflict = not same_keys or (prior[3] is not None and prior[3] != content_digest(ev))
                err = replay_conflict(conn, ev, prior) if conflict else None
            else:
                assert first is not None
                err = same_batch_conflict(first, ev)
            if err is not None:
                if strict:
                    raise err
                result.rejected.append(Rejected(ev, err))
                continue
            result.duplicates += 1
        todo = fresh
    stream = SpanStream(conn) if conn.dialect.name == "postgresql" and not replay and todo else None
    plan = _Plan(conn, cache, replay=replay, stream=stream)
    timings = result.timings
    try:
        plan.load(todo)
        timings["lookups"] = time.perf_counter() - clock
        plan.prepare_arrays(todo, spans=stream is not None)
        timings["digests"] = time.perf_counter() - clock - timings["lookups"]
        for ev in todo:
            try:
                plan.plan(ev)
            except (ValidationError, ConflictError) as exc:
                if strict:
                    raise
                result.rejected.append(Rejected(ev, exc))
                continue
            result.applied.append(ev)
            result.tokens += ev.n_tokens()
        streamed = stream.seconds if stream is not None else 0.0
        timings["plan"] = time.perf_counter() - clock - timings["lookups"] - timings["digests"] - streamed
        _write(conn, plan, timings)
    except BaseException as exc:
        if stream is not None:
            stream.abort(exc)
        raise
    result.new_states = {nid: plan.states[nid] for nid in plan.new_nodes if nid in plan.states}
    return result


def _write(conn: Connection, plan: _Plan, timings: dict[str, float]) -> None:
    """Bulk-write a plan's rows into the caller's transaction; add phase seconds to ``timings``."""
    clock = time.perf_counter()
    stream = plan.stream
    span_rows = new_span_rows(conn, plan.spans) if stream is None and not plan.replay and plan.spans else []
    spans_s = time.perf_counter() - clock
    planned_stream_s = stream.seconds if stream is not None else 0.0
    building = 0.0
    inserts: list[tuple[sa.Table, list[dict[str, Any]]]] = [
        (t.events, plan.rows["events"]),
        (t.executions, [plan.execs[x] for x in sorted(plan.new_execs)]),
        (t.nodes, list(plan.new_nodes.values())),
        *((getattr(t, name), plan.rows[name]) for name in ("calls", "segments", "scores", "policy_versions")),
    ]
    small: list[tuple[sa.Table, list[dict[str, Any]]]] = []
    if conn.dialect.name == "postgresql":
        builders: list[Callable[[], Payload]] = [functools.partial(spans_payload, span_rows)] if span_rows else []
        for table, rows in inserts:
            if len(rows) >= COPY_MIN_ROWS:
                builders.append(functools.partial(text_payload, table, rows))
            elif rows:
                small.append((table, rows))
        if stream is not None:
            # Its last rows still go out and are stored while the first table's payload is built.
            stream.flush()
        building = send_overlapped(conn, builders, finish_previous=stream.close if stream is not None else None)
    else:
        insert_span_rows(conn, span_rows)
        small = [(table, rows) for table, rows in inserts if rows]
    for table, rows in small:
        conn.execute(table.insert(), rows)
    _bulk_update_nodes(conn, plan.node_updates)
    write_cells(conn, plan)
    touched = [plan.execs[x] for x in plan.execs if x not in plan.new_execs]
    if touched:
        cols = [c.name for c in t.executions.columns if c.name != "execution_id"]
        stmt = (
            t.executions.update()
            .where(t.executions.c.execution_id == sa.bindparam("_eid"))
            .values({c: sa.bindparam(c) for c in cols})
        )
        conn.execute(stmt, [{"_eid": r["execution_id"], **{c: r[c] for c in cols}} for r in touched])
    flushed_s = stream.seconds - planned_stream_s if stream is not None else 0.0
    timings["spans"] = spans_s + (stream.seconds if stream is not None else 0.0)
    timings["payloads"] = building
    timings["store"] = time.perf_counter() - clock - spans_s - flushed_s - building


def _bulk_update_nodes(conn: Connection, updates: dict[str, dict[str, Any]]) -> None:
    groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for nid, values in updates.items():
        groups.setdefault(tuple(sorted(values)), []).append({"_nid": nid, **values})
    for keys, rows in groups.items():
        stmt = (
            t.nodes.update()
            .where(t.nodes.c.node_id == sa.bindparam("_nid"))
            .values({k: sa.bindparam(k) for k in keys})
        )
        conn.execute(stmt, rows)


__all__ = ["ApplyResult", "ContextCache", "Rejected", "apply_events"]
