"""The tree rules docs/wire-format.md §6 states: node roles, what a fork's ``at_node`` and ``branches``
must be, and which nodes are valid ``leaf_rewards`` keys."""

from __future__ import annotations

import uuid

import numpy as np
import pytest
import sqlalchemy as sa

from sapwood.platform import schema as t
from sapwood.platform.events import ExecutionFinished, Fork, ModelCall
from sapwood.platform.store import Store
from sapwood.platform.tree import Role
from sapwood.platform.writer import ExecutionWriter


def _tree() -> tuple[ExecutionWriter, dict[str, str]]:
    w = ExecutionWriter(run_id="rules", task_id="t")
    w.start()
    p = w.prompt(np.arange(5, dtype=np.int32))
    act = w.call(p.node_id, np.arange(2, dtype=np.int32), [7], [-0.1])
    obs = w.observe(act.output_node_id, [8, 9])
    summ = w.call(obs.node_id, [10], [11, 12], [-0.2, -0.3], kind="summary")
    seg = w.compact(summ.output_node_id, [11, 12])
    return w, {"prompt": p.node_id, "input": act.input_node_id or "", "action": act.output_node_id,
               "observation": obs.node_id, "summary": summ.output_node_id, "root": seg.root_node_id}


def _column(store: Store, column: sa.Column, node_id: str) -> object:
    with store.engine.connect() as conn:
        return conn.execute(sa.select(column).where(t.nodes.c.node_id == node_id)).scalar_one()


def test_each_node_gets_the_role_the_doc_names(store: Store) -> None:
    w, nodes = _tree()
    store.apply(w.events)
    expected = {"prompt": Role.PROMPT, "input": Role.PROMPT, "action": Role.ACTION, "observation": Role.OBSERVATION,
                "summary": Role.SUMMARY, "root": Role.PROMPT}
    assert {name: _column(store, t.nodes.c.role, n) for name, n in nodes.items()} == expected
    assert _column(store, t.nodes.c.segment, nodes["root"]) == 1


def _next(w: ExecutionWriter, event: Fork | ExecutionFinished) -> Fork | ExecutionFinished:
    event.execution_id, event.seq = w.execution_id, len(w.events)
    return event


def test_a_fork_at_a_node_of_no_execution_is_an_unknown_reference(store: Store) -> None:
    w, _ = _tree()
    store.apply(w.events)
    result = store.apply([_next(w, Fork(at_node=str(uuid.uuid4()), branches=2))], strict=False)
    assert [getattr(r.error, "reason", None) for r in result.rejected] == ["unknown_reference"]


def test_fork_branches_is_stored_unmatched_and_a_second_fork_replaces_it(store: Store) -> None:
    w, nodes = _tree()
    w.fork(nodes["observation"], 3)  # announces 3; only one child (the summary call) ever arrives
    store.apply(w.events)
    assert _column(store, t.nodes.c.fork_branches, nodes["observation"]) == 3
    store.apply([_next(w, Fork(at_node=nodes["observation"], branches=2))])
    assert _column(store, t.nodes.c.fork_branches, nodes["observation"]) == 2


@pytest.mark.parametrize(("key", "reason"), [("action", None), ("observation", None), ("other", "unknown_reference")])
def test_leaf_rewards_keys_are_nodes_of_the_execution(store: Store, key: str, reason: str | None) -> None:
    w, nodes = _tree()
    other, _ = _tree()
    store.apply([*w.events, *other.events])
    other_call = next(e for e in other.events if isinstance(e, ModelCall))
    node = other_call.output_node_id if key == "other" else nodes[key]  # "observation" is not a leaf
    result = store.apply([_next(w, ExecutionFinished(reward=1.0, leaf_rewards={node: 0.5}))], strict=False)
    assert [getattr(r.error, "reason", None) for r in result.rejected] == ([reason] if reason else [])
