"""The planner's ports: what it reads of the store (:class:`StoredState`), where it streams new spans
(:class:`SpanSink`) and the plan it returns (:class:`PlannedWrites`).

The planner owns these types and depends on nothing below it; each storage dialect implements the two
protocols (:mod:`sapwood.platform.storage.applier`) and writes the plan. :func:`sapwood.platform.apply.apply_events`
connects the two.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
from sqlalchemy.engine import Connection

from sapwood.platform.replays import Prior
from sapwood.platform.tokens import TokenArray
from sapwood.platform.tree import NodeRecord

Row = dict[str, Any]
"""One row of a table, keyed by column name."""

ChildNode = tuple[str, bytes, int]
"""(node id, span digest, length) of a stored child node."""


@dataclass
class PlannedWrites:
    """Everything one planned batch writes, table by table (the planner's typed plan).

    Rows of ``events`` … ``policy_versions`` are inserted; ``node_updates`` (node id → column values)
    and ``touched_executions`` (whole rows) update rows stored before the batch; ``cells`` replace the
    cells ``replaced_cells`` names and add new ones. ``spans`` (digest → canonical int32 ids [n] or
    float32 log-probs [n]) are every span the batch references; an applier stores the ones not stored
    yet (unless ``replay``, when spans and events are already stored and only projections are written)."""

    replay: bool = False
    events: list[Row] = field(default_factory=list)
    new_executions: list[Row] = field(default_factory=list)
    touched_executions: list[Row] = field(default_factory=list)
    nodes: list[Row] = field(default_factory=list)
    node_updates: dict[str, Row] = field(default_factory=dict)
    calls: list[Row] = field(default_factory=list)
    segments: list[Row] = field(default_factory=list)
    scores: list[Row] = field(default_factory=list)
    policy_versions: list[Row] = field(default_factory=list)
    spans: dict[bytes, np.ndarray] = field(default_factory=dict)
    cells: list[Row] = field(default_factory=list)
    replaced_cells: list[str] = field(default_factory=list)
    decisions: list[Row] = field(default_factory=list)
    phases: list[Row] = field(default_factory=list)

    def inserts(self) -> list[tuple[str, list[Row]]]:
        """(table name, rows) of the tree and log tables, in the order they are written."""
        return [("events", self.events), ("executions", self.new_executions), ("nodes", self.nodes),
                ("calls", self.calls), ("segments", self.segments), ("scores", self.scores),
                ("policy_versions", self.policy_versions)]


class StoredState(Protocol):
    """The planner's reads of the store, inside the batch's transaction."""

    @property
    def conn(self) -> Connection:
        """The connection whose transaction the batch is planned and written in."""
        ...

    def prior_events(self, event_ids: Sequence[str]) -> dict[str, Prior]:
        """Stored events among ``event_ids``: id → (execution id, seq, kind, content digest)."""
        ...

    def stored_event(self, event_id: str) -> Mapping[str, Any] | None:
        """The stored ``events`` row of ``event_id`` (None when there is none)."""
        ...

    def executions(self, execution_ids: Sequence[str]) -> dict[str, Row]:
        """Stored ``executions`` rows of ``execution_ids``, locked for the transaction where the dialect can."""
        ...

    def nodes(self, node_ids: Sequence[str]) -> list[NodeRecord]:
        """Stored nodes among ``node_ids``."""
        ...

    def children(self, execution_id: str, parent: str | None) -> list[ChildNode]:
        """Stored children of ``parent`` (None: the context roots) in ``execution_id``, most recent first."""
        ...

    def path_tokens(self, node_id: str) -> TokenArray:
        """Token ids [n] of the context ending with stored node ``node_id``."""
        ...

    def stored_spans(self, digests: Iterable[bytes]) -> set[bytes]:
        """The subset of ``digests`` already stored."""
        ...

    def policy_version_exists(self, run_id: str, version: int) -> bool:
        """Whether version ``version`` of run ``run_id`` was published already."""
        ...

    def cell(self, cell_id: str) -> Row | None:
        """The stored ``cells`` row of ``cell_id`` (None when the cell was never registered)."""
        ...


class SpanSink(Protocol):
    """Where new spans go as soon as their event is planned (a storage applier that streams them)."""

    #: Seconds spent so far encoding, framing and sending spans (overlaps planning).
    seconds: float

    def add(self, digest: bytes, canonical: np.ndarray, *, bits: int | None = None) -> None:
        """Queue one span not stored yet: ``canonical`` int32 ids [n] or float32 log-probs [n]; ``bits``
        the bitwise OR of its ids when known."""
        ...

    def abort(self, exc: BaseException) -> None:
        """Abandon what was streamed because the batch failed with ``exc``."""
        ...


__all__ = ["ChildNode", "PlannedWrites", "Row", "SpanSink", "StoredState"]
