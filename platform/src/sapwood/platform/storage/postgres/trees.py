"""The tree reader on PostgreSQL: each step of a path walk is an index probe whatever the statistics.

The step is a ``LATERAL`` sub-select with ``LIMIT 1``, which the planner cannot flatten into a hash
join over a full scan of ``nodes`` — what it picks for a plain recursive join on a young store
(32 ms for a 179-node path, not 1.4 ms; ``tests/platform/storage/test_tree_paths.py`` checks the plans).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from sapwood.platform import schema as t
from sapwood.platform.storage.trees_sql import SqlTreeReader


def lateral_step(path: sa.CTE, names: Sequence[str], next_id: sa.ColumnElement[Any]) -> tuple[sa.FromClause, Any]:
    """The next node of each path row as ``LATERAL (SELECT ... WHERE node_id = next LIMIT 1)``."""
    up = sa.select(*(t.nodes.c[n] for n in names)).where(t.nodes.c.node_id == next_id).limit(1).lateral("up")
    return path.join(up, sa.true()), up


class PostgresTreeReader(SqlTreeReader):
    """:class:`~sapwood.platform.storage.trees.TreeReader` for PostgreSQL."""

    step = staticmethod(lateral_step)
