"""Path reads of the tree reader (:mod:`sapwood.platform.storage.trees`, moved from ``test_spans.py``):
results on both backends, and query plans on PostgreSQL."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from sapwood.platform import schema as t
from sapwood.platform.errors import UnknownParentError
from sapwood.platform.events import ModelCall, SegmentBoundary
from sapwood.platform.storage.backends import tree_reader
from sapwood.platform.storage.calls import call_with_output
from sapwood.platform.storage.postgres.trees import PostgresTreeReader, lateral_step
from sapwood.platform.storage.sqlite.trees import SQLiteTreeReader, join_step
from sapwood.platform.storage.trees_sql import SqlTreeReader, Step, path_cte
from sapwood.platform.storage.trees_sql import across_segments as _across_segments
from sapwood.platform.store import Store
from sapwood.platform.synthetic import SynthConfig, synthetic_execution
from tests.support.histories import expected_input

_n = t.nodes.c
_STEPS: dict[str, Step] = {"postgresql": lateral_step, "sqlite": join_step}
_READERS: dict[str, SqlTreeReader] = {"postgresql": PostgresTreeReader(), "sqlite": SQLiteTreeReader()}
_NODE_PATH = {d: r.context_tokens_sql for d, r in _READERS.items()}
_CALL_PATH = {d: r.call_input_sql for d, r in _READERS.items()}


def _applied(store: Store, *, calls: int = 40) -> Any:
    """A small execution (forks, two segments, short arrays) applied to ``store``."""
    w = synthetic_execution(SynthConfig(seed=3, calls=calls, forks=2, segments=2, obs_min=20, obs_max=80, out_min=10,
                                        out_max=40, system_tokens=100, task_tokens=30, summary_tokens=40))
    store.apply(w.events)
    return w


def test_call_input_and_path_tokens_match_the_recorded_inputs(store: Store) -> None:
    w = _applied(store)
    calls = [e for e in w.events if isinstance(e, ModelCall)]
    with store.transaction() as conn:
        for call in calls:
            expected = expected_input(w, call)
            ids, recorded = tree_reader(conn).call_input(conn, call.call_id)
            np.testing.assert_array_equal(ids, expected)
            assert recorded == expected.size
            np.testing.assert_array_equal(tree_reader(conn).context_tokens(conn, call.output_node_id),
                                          np.concatenate([expected, call.output_ids]))


def test_call_context_is_the_call_row_and_the_input_context_in_one_statement(store: Store) -> None:
    w = _applied(store, calls=12)
    calls = [e for e in w.events if isinstance(e, ModelCall)]
    statements: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_rest: Any) -> None:
        statements.append(statement)

    with store.transaction() as conn:
        reader = tree_reader(conn)
        for call in calls:
            sa.event.listen(conn, "before_cursor_execute", record)
            row, parts = reader.call_context(conn, call.call_id)
            sa.event.remove(conn, "before_cursor_execute", record)
            assert len(statements) == 1
            statements.clear()
            assert row == call_with_output(conn, call.call_id)
            assert parts == reader.context(conn, row["input_node"])
            np.testing.assert_array_equal(np.frombuffer(b"".join(p.data for p in parts), "<i4"),
                                          expected_input(w, call))
        with pytest.raises(UnknownParentError, match="model call"):
            reader.call_context(conn, "00000000-0000-4000-8000-000000000000")


def test_unknown_ids_are_named_in_the_error(store: Store) -> None:
    _applied(store)
    missing = "00000000-0000-4000-8000-000000000000"
    with store.transaction() as conn:
        with pytest.raises(UnknownParentError, match=f"model call {missing} does not exist"):
            tree_reader(conn).call_input(conn, missing)
        with pytest.raises(UnknownParentError, match=f"node {missing} does not exist"):
            tree_reader(conn).context_tokens(conn, missing)


def test_path_cte_crosses_compactions_with_a_link(store: Store) -> None:
    """``link`` = parent or, at a segment root, the summary it continues: the walk reaches the first root."""
    w = _applied(store)
    boundary = next(e for e in w.events if isinstance(e, SegmentBoundary))
    cols = (_n.node_id, _n.parent_id, _n.prev_segment_node, _n.segment)
    with store.transaction() as conn:
        path = path_cte(sa.select(*cols, sa.literal(0).label("k")).where(_n.node_id == boundary.root_node_id),
                        _STEPS[conn.dialect.name], link=_across_segments, counter="k", name="lpath")
        rows = conn.execute(sa.select(*path.c).order_by(path.c.k)).all()
        plain = path_cte(sa.select(*cols).where(_n.node_id == boundary.root_node_id), _STEPS[conn.dialect.name])
        within = conn.execute(sa.select(sa.func.count()).select_from(plain)).scalar_one()
    assert [r.k for r in rows] == list(range(len(rows)))
    assert rows[0].node_id == boundary.root_node_id
    assert rows[1].node_id == boundary.from_node
    assert rows[-1].parent_id is None
    assert rows[-1].prev_segment_node is None
    assert rows[-1].segment == 0
    assert within == 1  # without the link the walk stops at the segment's root


def _plan_nodes(plan: Any) -> list[dict[str, Any]]:
    out = [plan]
    for child in plan.get("Plans", []):
        out.extend(_plan_nodes(child))
    return out


def _scans_nodes(conn: Connection, stmt: sa.Select[Any], values: dict[str, Any]) -> set[str]:
    """Scan types PostgreSQL's plan for ``stmt`` (with ``values``) uses on ``nodes``."""
    compiled = stmt.compile(dialect=conn.dialect)
    params = {**compiled.params, **values}
    (doc,) = conn.exec_driver_sql("EXPLAIN (FORMAT JSON) " + str(compiled), params).scalar_one()
    return {p["Node Type"] for p in _plan_nodes(doc["Plan"]) if p.get("Relation Name") == "nodes"}


@pytest.mark.postgres
def test_path_walks_probe_the_index_on_a_young_store(pg_url: str) -> None:
    """On a store of about a thousand nodes PostgreSQL hash-joins a full scan of ``nodes`` at every step of a
    plain recursive join; the walks must stay index probes."""
    store = Store.open(pg_url)
    try:
        w = _applied(store, calls=300)
        call = [e for e in w.events if isinstance(e, ModelCall)][-1]
        with store.transaction() as conn:
            conn.execute(sa.text("ANALYZE nodes"))
            assert _scans_nodes(conn, _NODE_PATH["postgresql"], {"node_id": call.output_node_id}) <= {"Index Scan"}
            assert _scans_nodes(conn, _CALL_PATH["postgresql"], {"call_id": call.call_id}) <= {"Index Scan"}
            start = sa.select(_n.node_id, _n.parent_id).where(_n.node_id == call.output_node_id)
            # The control, so that the assertions above can fail: the same walk as a plain recursive join
            # (the form path_cte builds for SQLite) is planned with a full scan of nodes on this store.
            plain = path_cte(start, join_step)
            assert "Seq Scan" in _scans_nodes(conn, sa.select(*plain.c), {})
    finally:
        store.close()
