"""The tree reader: contexts, logical paths, subtrees and token pages of stored trajectory trees.

A node's *context* is its path to a root over ``parent_id``; its *logical path* crosses compactions
through :func:`sapwood.platform.tree.logical_parent_sql` (a segment root continues the summary named
by its ``prev_segment_node``). Everything the API and the learner read about stored trees goes
through :class:`TreeReader`; callers own the transaction (every method takes the open
:class:`~sqlalchemy.engine.Connection`).

Semantics every implementation keeps (``tests/platform/storage/test_tree_reader_contract.py``):

* a node or call id that is not stored raises :class:`~sapwood.platform.errors.UnknownParentError`
  naming it (``node <id> does not exist``);
* :meth:`TreeReader.nodes` lists an execution's nodes in creation order (parents first) with their
  tree level (a segment root one below the summary it continues) and logical child count;
* paths and contexts are root first; token pages are ``[start, stop)`` slices of whole nodes.

:func:`tree_reader` picks the implementation for a dialect: :mod:`.sqlite.trees` (a plain recursive
join) or :mod:`.postgres.trees` (each recursive step a ``LATERAL ... LIMIT 1`` index probe).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import numpy as np
from sqlalchemy.engine import Connection

from sapwood.platform.tokens import TokenArray
from sapwood.platform.tree import NodeRecord


@dataclass(slots=True)
class TreeNode(NodeRecord):
    """One node of an execution's tree, with its tree facts."""

    is_leaf: bool
    fork_branches: int
    call_id: str | None
    policy_version: int | None
    seq: int
    level: int = 0
    """Tree level: 0 at a context root of segment 0, a segment root one below the summary it continues."""
    n_children: int = 0
    """Nodes whose logical parent this node is (children, and segment roots continuing it)."""


@dataclass(slots=True)
class PathNode(NodeRecord):
    """One node of a logical path (root first), with its span and its offset in the path's tokens."""

    span_digest: bytes
    call_id: str | None
    policy_version: int | None
    offset: int = 0
    """Tokens of the logical path before this node (across segments)."""


@dataclass(slots=True)
class ContextNode:
    """One node of a context (root first) and its canonical packed tokens (``int32`` little-endian)."""

    node_id: str
    role: int
    depth: int
    length: int
    call_id: str | None
    policy_version: int | None
    data: bytes


@dataclass(slots=True)
class BatchNode:
    """A node row as the learner's batch source needs it."""

    node_id: str
    execution_id: str
    parent_id: str | None
    prev_segment_node: str | None
    role: int
    span_digest: bytes
    length: int
    depth: int
    segment: int
    is_leaf: bool
    call_id: str | None
    policy_version: int | None


@dataclass
class BatchRows:
    """What a batch is built from: executions, their nodes and their calls' log-prob digests."""

    executions: dict[str, Any]
    """execution id → its ``executions`` row (attribute access: ``status``, ``reward``, ``leaf_rewards``, ...)."""
    nodes: dict[str, list[BatchNode]] = field(default_factory=dict)
    """execution id → its nodes (executions without nodes are absent)."""
    logprob_digests: dict[str, bytes] = field(default_factory=dict)
    """call id → digest of the call's rollout log-probs span."""


class PageSlice(NamedTuple):
    """Tokens ``[start, stop)`` of a node's span, and the call whose log-probs to slice alike (or None)."""

    span_digest: bytes
    call_id: str | None
    start: int
    stop: int


class TokenPage(NamedTuple):
    """Token ids (``int32 [stop-start]``) and rollout log-probs (``float32``, or None: not a call's output)."""

    token_ids: TokenArray
    logprobs: np.ndarray | None


class TreeReader(Protocol):
    """Reads of stored trajectory trees on one backend; see the module docstring for the contract."""

    def nodes(self, conn: Connection, execution_id: str) -> list[TreeNode]:
        """Every node of the execution in creation order (parents first), with levels and child counts."""
        ...

    def node_prefix(self, conn: Connection, execution_id: str, max_nodes: int,
                    max_level: int | None) -> list[TreeNode]:
        """The first ``max_nodes`` nodes (creation order) within ``max_level``, reading no more rows than
        needed; child counts over the whole tree."""
        ...

    def node(self, conn: Connection, node_id: str) -> tuple[TreeNode, bytes]:
        """One node with its level and child count, and its span digest."""
        ...

    def segment_roots(self, conn: Connection, execution_id: str,
                      nodes: Iterable[TreeNode] | None = None) -> list[dict[str, Any]]:
        """``{segment, root_node, from_node, seq}`` of the context roots of segment 0, then one per
        compaction, in event order; ``nodes`` (the whole tree, if already read) saves a query."""
        ...

    def logical_path(self, conn: Connection, node_id: str) -> list[PathNode]:
        """Nodes from the first root to ``node_id`` across compactions, with their offsets (one query)."""
        ...

    def context(self, conn: Connection, node_id: str) -> list[ContextNode]:
        """The context's nodes from its root to ``node_id`` with their tokens (one query)."""
        ...

    def context_tokens(self, conn: Connection, node_id: str) -> TokenArray:
        """Token ids ``int32 [L]`` of the context that ends with ``node_id`` (one query)."""
        ...

    def call_context(self, conn: Connection, call_id: str) -> tuple[dict[str, Any], list[ContextNode]]:
        """A model call's row as :func:`sapwood.platform.storage.calls.call_with_output` gives it, and its
        input's context (root first) as :meth:`context` does: one query."""
        ...

    def call_input(self, conn: Connection, call_id: str) -> tuple[TokenArray, int]:
        """A model call's input ids ``int32 [L]`` rebuilt from the tree, and the length it recorded."""
        ...

    def token_pages(self, conn: Connection, slices: Sequence[PageSlice]) -> list[TokenPage]:
        """The token (and log-prob) slices asked for, in order (three queries at most)."""
        ...

    def execution_spans(self, conn: Connection, execution_id: str
                        ) -> tuple[dict[str, TokenArray], dict[str, np.ndarray]]:
        """Token ids of every node, and rollout log-probs of every call's output node, by node id."""
        ...

    def leaf_facts(self, conn: Connection, node_id: str) -> Mapping[str, Any] | None:
        """``status reward score leaf_rewards`` of the node's execution and its ``is_leaf``; None if absent."""
        ...

    def batch_rows(self, conn: Connection, execution_ids: Sequence[str]) -> BatchRows:
        """Executions, nodes and log-prob digests of ``execution_ids`` (ids not stored are absent)."""
        ...
