"""Property-based tests over random histories of calls, observations, forks and compactions."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sapwood.platform import schema as t
from sapwood.platform.events import ModelCall
from sapwood.platform.span_encoding import decode_span
from sapwood.platform.store import Store
from sapwood.platform.tokens import digest_bytes
from sapwood.platform.writer import ExecutionWriter
from tests.support.histories import expected_input

VOCAB = 64
# One op: (kind, which existing node to continue from, length, payload seed)
OPS = st.lists(
    st.tuples(st.sampled_from(["action", "action", "summary", "observe", "fork", "compact", "full"]),
              st.integers(0, 10_000), st.integers(0, 12), st.integers(0, 2**31 - 1)),
    min_size=1, max_size=30,
)


def build_history(ops: list[tuple[str, int, int, int]], n_exec: int) -> list[ExecutionWriter]:
    """Interpret random ops into valid executions (identical prompts are shared across them)."""
    writers = []
    for x in range(n_exec):
        w = ExecutionWriter(run_id="prop", task_id=f"t{x % 2}", vocab_size=VOCAB)
        w.start()
        frontier = [w.prompt(np.arange(8, dtype=np.int32), source="system").node_id]  # shared system prompt
        summaries: list[str] = []
        for kind, pick, length, seed in ops:
            rng = np.random.default_rng(seed + x)
            node = frontier[pick % len(frontier)]
            toks = rng.integers(0, VOCAB, length, dtype=np.int32)
            if kind in ("action", "summary"):
                out = rng.integers(0, VOCAB, 1 + length % 5, dtype=np.int32)
                ev = w.call(node, toks, out, -rng.random(out.size).astype(np.float32), kind=kind)
                frontier.append(ev.output_node_id)
                if kind == "summary":
                    summaries.append(ev.output_node_id)
            elif kind == "full":
                full = np.concatenate([w.context(node), toks])
                if full.size:
                    ev = w.call(None, full, [1], [-0.5])
                    frontier.append(ev.output_node_id)
            elif kind == "observe" and length:
                frontier.append(w.observe(node, toks).node_id)
            elif kind == "fork":
                w.fork(node, 2 + length % 3)
            elif kind == "compact" and summaries:
                src = summaries[pick % len(summaries)]
                frontier.append(w.compact(src, np.concatenate([[1, 2], toks]).astype(np.int32)).root_node_id)
        w.finish("success", reward=float(len(ops) % 3))
        writers.append(w)
    return writers


def _clear(store: Store) -> None:
    with store.transaction() as conn:
        for table in (t.events, t.spans, *t.PROJECTION_TABLES):
            conn.execute(table.delete())


def check_properties(store: Store, writers: list[ExecutionWriter]) -> None:
    _clear(store)
    for w in writers:
        assert not store.apply(w.events).rejected
    for w in writers:
        for call in (e for e in w.events if isinstance(e, ModelCall)):
            np.testing.assert_array_equal(store.reconstruct_input(call.call_id), expected_input(w, call))
    with store.transaction() as conn:
        rows = [(bytes(d), decode_span(enc, x))
                for d, enc, x in conn.execute(sa.select(t.spans.c.digest, t.spans.c.encoding, t.spans.c.data))]
        referenced = {bytes(r[0]) for r in conn.execute(sa.select(t.nodes.c.span_digest))}
        referenced |= {bytes(r[0]) for r in conn.execute(sa.select(t.calls.c.logprobs_digest))}
        tree_tokens = conn.execute(sa.select(sa.func.sum(t.nodes.c.length))).scalar_one()
    assert all(digest_bytes(data) == d for d, data in rows), "spans are addressed by their content"
    assert len({data for _, data in rows}) == len(rows), "each distinct span is stored once"
    assert {d for d, _ in rows} == referenced, "every stored span is used by the tree or a call"
    written = sum(int(a.size) for w in writers for e in w.events for n, a in e.array_fields().items()
                  if n != "output_logprobs")
    assert tree_tokens <= written
    live = store.projection_hash()
    store.rebuild_projections()
    assert store.projection_hash() == live


@pytest.fixture(scope="module")
def sqlite_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    store = Store.open(f"sqlite:///{tmp_path_factory.mktemp('prop') / 's.db'}")
    yield store
    store.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS, n_exec=st.integers(1, 3))
def test_random_histories_sqlite(ops: list[tuple[str, int, int, int]], n_exec: int, sqlite_store: Store) -> None:
    check_properties(sqlite_store, build_history(ops, n_exec))


@pytest.mark.postgres
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS, n_exec=st.integers(1, 3))
def test_random_histories_postgres(ops: list[tuple[str, int, int, int]], n_exec: int, pg_url: str) -> None:
    store = Store.open(pg_url)
    try:
        check_properties(store, build_history(ops, n_exec))
    finally:
        store.close()
