"""What apply returns, and the cache of prefix hash states it reads and fills."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from sapwood.platform.errors import SapwoodError
from sapwood.platform.events import Event

Hasher = Any  # hashlib.blake2b object


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
    """Outcome of one :func:`~sapwood.platform.apply.apply_events` call."""

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


__all__ = ["ApplyResult", "ContextCache", "Hasher", "Rejected"]
