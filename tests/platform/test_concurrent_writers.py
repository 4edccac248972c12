"""Two writers storing the same new span at once: the later one gets a conflict, retries, and both land."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import sqlalchemy as sa

from sapwood.platform import schema as t
from sapwood.platform.apply import apply_events
from sapwood.platform.errors import ConflictError
from sapwood.platform.events import ModelCall
from sapwood.platform.store import Store
from sapwood.platform.writer import ExecutionWriter

pytestmark = pytest.mark.postgres


def _execution(seed: int, shared: np.ndarray) -> ExecutionWriter:
    rng = np.random.default_rng(seed)
    w = ExecutionWriter(run_id="r", task_id=f"t{seed}", vocab_size=1000)
    w.start()
    root = w.prompt(shared).node_id  # the same system prompt: one span, wanted by both writers
    for _ in range(40):  # enough rows for every table to take the COPY path
        out = w.call(root, rng.integers(0, 1000, 5), rng.integers(0, 1000, 4), -rng.random(4)).output_node_id
        root = w.observe(out, rng.integers(0, 1000, 6)).node_id
    w.finish("success", reward=1.0)
    return w


@pytest.mark.parametrize("retries", [0, 3])
def test_same_new_span_from_two_transactions(pg_url: str, retries: int) -> None:
    store = Store.open(pg_url)
    shared = np.arange(300, 700, dtype=np.int32)
    first, second = _execution(1, shared), _execution(2, shared)
    applied = threading.Event()
    release = threading.Event()

    def hold_open() -> None:
        with store.transaction() as conn:
            apply_events(conn, first.events)
            applied.set()
            release.wait(10)  # commit only after the second writer has started its COPY

    holder = threading.Thread(target=hold_open)
    holder.start()
    assert applied.wait(10)
    result: dict[str, object] = {}
    def race() -> None:
        try:
            result["r"] = store.apply(second.events, retries=retries)
        except ConflictError as exc:
            result["error"] = exc

    racer = threading.Thread(target=race)
    racer.start()
    racer.join(1.0)
    assert racer.is_alive(), "the second writer waits on the first one's uncommitted span"
    release.set()
    holder.join(10)
    racer.join(20)
    assert not racer.is_alive()
    if retries == 0:  # the race really happened, surfaced as Sapwood's conflict error
        assert "constraint" in str(result["error"])
        assert "r" not in result
        store.close()
        return
    assert "r" in result, result
    for w in (first, second):
        for call in (e for e in w.events if isinstance(e, ModelCall)):
            assert store.reconstruct_input(call.call_id).size > 0
    with store.transaction() as conn:
        n_spans = conn.execute(sa.select(sa.func.count()).select_from(t.spans)
                               .where(t.spans.c.data.isnot(None))).scalar_one()
        n_events = conn.execute(sa.select(sa.func.count()).select_from(t.events)).scalar_one()
    assert n_events == len(first.events) + len(second.events)
    assert n_spans > 0
    store.close()
