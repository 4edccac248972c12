"""The node record and the logical-parent rule.

A node's *context* is its path to a root over ``parent_id``. A *logical trajectory* crosses
compactions: the root of segment k>0 has no parent but names, in ``prev_segment_node``, the summary
node of segment k-1 it continues. Its logical parent is therefore ``parent_id``, or for a segment
root ``prev_segment_node`` — the rule :func:`logical_parent` (Python) and :func:`logical_parent_sql`
(inside a recursive query) state once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa


def logical_parent(parent_id: str | None, prev_segment_node: str | None) -> str | None:
    """The node before this one on its logical trajectory: its parent, else the summary a segment root continues."""
    return parent_id if parent_id is not None else prev_segment_node


def logical_parent_sql(parent_id: sa.ColumnElement[Any], prev_segment_node: sa.ColumnElement[Any]
                       ) -> sa.ColumnElement[Any]:
    """:func:`logical_parent` as a SQL expression over two columns (for recursive path queries)."""
    return sa.func.coalesce(parent_id, prev_segment_node)


@dataclass(slots=True)
class NodeRecord:
    """One stored node of a trajectory tree, as readers see it.

    ``depth`` is the number of context tokens before the node (its offset in its segment's context),
    ``length`` its own token count; ``segment`` counts compactions before it.
    """

    node_id: str
    execution_id: str
    parent_id: str | None
    prev_segment_node: str | None
    role: int
    """A :class:`~sapwood.platform.tree.Role` code (records are built from plain integers)."""
    depth: int
    length: int
    segment: int

    @property
    def end(self) -> int:
        """Context length up to and including this node (tokens)."""
        return self.depth + self.length

    @property
    def up(self) -> str | None:
        """The node before this one on its logical trajectory (:func:`logical_parent`)."""
        return logical_parent(self.parent_id, self.prev_segment_node)
