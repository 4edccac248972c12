"""The trajectory tree as a batch changes it: node look-ups, new nodes, leaf flags and prefix hash states.

Every node the batch refers to is loaded once as a :class:`~sapwood.platform.tree.NodeRecord`;
nodes its events create join the same map, so later events of the batch find them. A node's
*state* is the BLAKE2b input hasher after its context's last token, from which a model call's
input digest is checked in O(appended tokens).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

import numpy as np

from sapwood.platform.errors import ConflictError, UnknownParentError
from sapwood.platform.events import Event
from sapwood.platform.planner.ports import ChildNode, Row, StoredState
from sapwood.platform.planner.results import ContextCache, Hasher
from sapwood.platform.planner.span_effects import Refs, SpanEffects
from sapwood.platform.tokens import digest_bytes, input_hasher, pack
from sapwood.platform.tree import NodeRecord, Role, logical_parent, match_prefix

#: Node values set on a parent when a child is added.
_NOT_A_LEAF = {"is_leaf": False}

_NODE_ATTRS: dict[type[Event], tuple[tuple[str, ...], tuple[str, ...]]] = {}


def node_attrs(cls: type[Event]) -> tuple[tuple[str, ...], tuple[str, ...]]:
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


def root_state(tokens: np.ndarray) -> Hasher:
    """Input hasher after ``tokens`` [n] int32, the first tokens of a context."""
    state = input_hasher()
    state.update(np.ascontiguousarray(tokens).data)
    return state


class TreeEffects:
    """Nodes of a batch: the stored ones it refers to, the ones it creates, and updates of stored ones."""

    def __init__(self, state: StoredState, spans: SpanEffects, cache: ContextCache | None) -> None:
        self._state = state
        self._spans = spans
        self._cache = cache
        self.nodes: dict[str, NodeRecord] = {}
        #: node id → row to insert, for the nodes this batch creates.
        self.new_rows: dict[str, Row] = {}
        #: node id → column values to set on a node stored before the batch.
        self.updates: dict[str, Row] = {}
        #: parent id (None: context roots) → ids of the batch's new children, oldest first.
        self._children_new: dict[str | None, list[str]] = {}
        #: node ids created by events of this batch (never looked up in the store).
        self._batch_ids: set[str] = set()
        #: node id → prefix hash state after the node (new nodes, and stored ones rebuilt).
        self.states: dict[str, Hasher] = {}

    def load(self, events: Sequence[Event]) -> None:
        """Load the stored nodes ``events`` refer to (not those the batch itself creates)."""
        created: set[str] = set()
        for e in events:
            for name in node_attrs(type(e))[0]:
                ref = getattr(e, name)
                if ref:
                    created.add(ref)
        refs: set[str] = set()
        for e in events:
            for name in node_attrs(type(e))[1]:
                ref = getattr(e, name)
                if ref and ref not in created:
                    refs.add(ref)
        self._batch_ids = created
        self._load(refs)

    def _load(self, node_ids: Iterable[str]) -> None:
        wanted = [n for n in node_ids if n not in self.nodes]
        if wanted:
            for node in self._state.nodes(wanted):
                self.nodes[node.node_id] = node

    # -- checks -----------------------------------------------------------------------------------------
    def node(self, node_id: str, execution_id: str, what: str) -> NodeRecord:
        """Node ``node_id`` of ``execution_id`` (stored, or created earlier in the batch), or raise."""
        node = self.nodes.get(node_id)
        if node is None and node_id not in self._batch_ids:
            self._load([node_id])
            node = self.nodes.get(node_id)
        if node is None or node.execution_id != execution_id:
            raise UnknownParentError(
                f"{what} {node_id} is not a node of execution {execution_id}; expected the id of a node "
                "created by an earlier event of the same execution"
            )
        return node

    def check_new(self, node_id: str, event: Event) -> None:
        """Refuse a node id the store or the batch already has."""
        if node_id in self.nodes:
            raise ConflictError(f"node {node_id} already exists (event {event.event_id} reuses its id)")

    def state(self, node_id: str) -> Hasher:
        """Hash state of the full context ending at ``node_id``."""
        state = self.states.get(node_id)
        if state is None and self._cache is not None:
            state = self._cache.get(node_id)
        if state is None:
            state = input_hasher()
            state.update(pack(self._state.path_tokens(node_id)))
            self.states[node_id] = state
        return state

    def child_state(self, parent: str | None, data: bytes | memoryview) -> Hasher:
        """Hash state after ``data`` (canonical token bytes) appended to ``parent``'s context."""
        state = input_hasher() if parent is None else self.state(parent).copy()
        state.update(data)
        return state

    # -- effects (called only once every check of the event has passed) ------------------------------
    def add(self, event: Event, execution_id: str, refs: Refs, *, node_id: str, parent: NodeRecord | None,
            role: Role, name: str, tokens: np.ndarray, state: Hasher, segment: int | None = None,
            prev_segment_node: str | None = None, call_id: str | None = None,
            policy_version: int | None = None) -> NodeRecord:
        """Record a node of ``tokens`` (the event's array ``name``) under ``parent``; ``state``: the context
        hash after its last token. ``node_id`` was checked with :meth:`check_new`."""
        digest = self._spans.add(refs, name, tokens)
        assert digest is not None
        length = int(tokens.size)
        parent_id = parent.node_id if parent is not None else None
        node = NodeRecord(node_id, execution_id, parent_id, prev_segment_node, role,
                          parent.end if parent is not None else 0, length,
                          segment if segment is not None else (parent.segment if parent is not None else 0))
        self.new_rows[node_id] = {
            "node_id": node_id,
            "execution_id": execution_id,
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
        self._children_new.setdefault(parent_id, []).append(node_id)
        self.states[node_id] = state
        before = logical_parent(parent_id, prev_segment_node)
        if before:
            self.update(before, _NOT_A_LEAF)
        return node

    def update(self, node_id: str, values: Row) -> None:
        """Set ``values`` on a node: in its row when this batch created it, else as an update after the inserts."""
        row = self.new_rows.get(node_id)
        if row is not None:
            row.update(values)
        else:
            self.updates.setdefault(node_id, {}).update(values)

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

    def _children(self, execution_id: str, parent: str | None) -> list[ChildNode]:
        """(node id, span digest, length) of ``parent``'s children (None: the context roots), most recent first."""
        out = self._state.children(execution_id, parent)
        for nid in self._children_new.get(parent, []):
            row = self.new_rows[nid]
            if row["execution_id"] == execution_id:
                out.insert(0, (nid, row["span_digest"], row["length"]))
        return out

    def new_states(self) -> dict[str, Hasher]:
        """Prefix states of the nodes the batch created (to merge into the cache after commit)."""
        return {nid: self.states[nid] for nid in self.new_rows if nid in self.states}


__all__ = ["TreeEffects", "node_attrs", "root_state"]
