"""The tree reader on SQLite: each step of a path walk is a plain join of the path to ``nodes``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from sapwood.platform import schema as t
from sapwood.platform.storage.trees_sql import SqlTreeReader


def join_step(path: sa.CTE, names: Sequence[str], next_id: sa.ColumnElement[Any]) -> tuple[sa.FromClause, Any]:
    """The next node of each path row, by a join (SQLite plans it as a primary-key lookup)."""
    up = t.nodes.alias("up")
    return path.join(up, up.c.node_id == next_id), up


class SQLiteTreeReader(SqlTreeReader):
    """:class:`~sapwood.platform.storage.trees.TreeReader` for SQLite."""

    step = staticmethod(join_step)
