"""Parquet export: trajectory and node rows equal what the producers recorded; readable by common tools."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sapwood.api.queries.export import NODE_SCHEMA, TRAJECTORY_SCHEMA, ParquetExport
from sapwood.platform.execution_filter import ExecutionFilter
from sapwood.platform.store import Store
from sapwood.platform.writer import ExecutionWriter
from tests.support.api_client import Keys, TestClient, calls_of, latest_score, logical_trajectory

ROLE_CODES = {"prompt": 0, "observation": 1, "action": 2, "summary": 3}


def export(client: TestClient, keys: Keys, **params: Any) -> bytes:
    r = client.get("/v1/export.parquet", headers=keys.headers("read"), params=params)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/vnd.apache.parquet"
    assert r.headers["content-disposition"].startswith("attachment;")
    return r.content


def expected_rows(w: ExecutionWriter) -> dict[str, dict[str, Any]]:
    """Per leaf: tokens, roles, log-probs (NaN = null) as the writer recorded them."""
    logprobs = {c.output_node_id: c.output_logprobs for c in calls_of(w)}
    versions = {c.output_node_id: c.policy_version for c in calls_of(w)}
    out = {}
    for leaf in w.leaves():
        seg = logical_trajectory(w, leaf)
        path: list[str] = []
        node: str | None = leaf
        roots = {e.root_node_id: e.from_node for e in w.events if e.kind == "segment_boundary"}
        while node is not None:
            path.append(node)
            parent = w.nodes[node].parent
            node = parent if parent is not None else roots.get(node)
        path.reverse()
        roles = np.concatenate([np.full(w.nodes[n].tokens.size, ROLE_CODES[w.nodes[n].role]) for n in path])
        lps = np.concatenate([logprobs.get(n, np.full(w.nodes[n].tokens.size, np.nan, dtype=np.float32))
                              for n in path])
        vers = [versions.get(n) for n in path for _ in range(w.nodes[n].tokens.size)]
        out[leaf] = {"tokens": seg.tokens, "starts": seg.segment_starts, "roles": roles, "logprobs": lps,
                     "versions": vers}
    return out


def test_trajectory_rows_hold_the_recorded_tokens_roles_and_logprobs(
        client: TestClient, keys: Keys, writers: list[ExecutionWriter]) -> None:
    table = pq.read_table(io.BytesIO(export(client, keys)))
    assert table.schema.equals(TRAJECTORY_SCHEMA, check_metadata=False)
    assert table.num_rows == sum(len(w.leaves()) for w in writers)
    by_leaf = {r["leaf_node_id"]: r for r in table.to_pylist()}
    for w in writers:
        for leaf, want in expected_rows(w).items():
            row = by_leaf[leaf]
            assert row["execution_id"] == w.execution_id
            assert row["run_id"] == "rollout-a"
            assert np.array_equal(np.array(row["token_ids"], dtype=np.int32), want["tokens"])
            assert row["segment_starts"] == want["starts"]
            assert row["n_segments"] == len(want["starts"])
            assert row["roles"] == want["roles"].tolist()
            got = np.array([np.nan if x is None else x for x in row["logprobs"]], dtype=np.float32)
            assert np.array_equal(got, want["logprobs"], equal_nan=True)
            assert row["policy_versions"] == want["versions"]
            assert row["n_tokens"] == want["tokens"].size
            assert row["n_trainable"] == int(np.isin(want["roles"], [2, 3]).sum())
            score = latest_score(w)
            if score is not None:
                assert row["reward"] == score == row["score"]
                assert row["status"] == "timeout"


def test_node_rows_store_each_node_once(client: TestClient, keys: Keys, writers: list[ExecutionWriter]) -> None:
    table = pq.read_table(io.BytesIO(export(client, keys, rows="node", status="success")))
    assert table.schema.equals(NODE_SCHEMA, check_metadata=False)
    successes = [w for w in writers if latest_score(w) is None]
    assert table.num_rows == sum(len(w.nodes) for w in successes)
    outputs = {c.output_node_id: c for w in successes for c in calls_of(w)}
    nodes = {nid: n for w in successes for nid, n in w.nodes.items()}
    for row in table.to_pylist():
        node = nodes[row["node_id"]]
        assert row["token_ids"] == node.tokens.tolist()
        assert row["role_name"] == node.role
        assert row["parent_id"] == node.parent
        assert row["segment"] == node.segment
        if row["node_id"] in outputs:
            assert np.array_equal(np.array(row["logprobs"], dtype=np.float32),
                                  outputs[row["node_id"]].output_logprobs)
        else:
            assert row["logprobs"] is None
            assert row["call_id"] is None


def test_filters_limits_and_empty_exports(client: TestClient, keys: Keys, writers: list[ExecutionWriter]) -> None:
    one = pq.read_table(io.BytesIO(export(client, keys, limit=1)))
    assert set(one.column("execution_id").to_pylist()) == {writers[0].execution_id}  # oldest first
    none = pq.read_table(io.BytesIO(export(client, keys, task_id="no-such-task")))
    assert none.num_rows == 0
    assert none.schema.equals(TRAJECTORY_SCHEMA, check_metadata=False)
    r = client.get("/v1/export.parquet", headers=keys.headers("read"), params={"limit": 10**6})
    assert r.status_code == 422
    schema = client.get("/v1/export/schema", headers=keys.headers("read"), params={"rows": "node"}).json()
    assert [c["name"] for c in schema] == NODE_SCHEMA.names
    assert all(c["description"] for c in schema)


def test_the_stream_has_several_row_groups_for_big_exports(pg_store: Store, writers: list[ExecutionWriter]) -> None:
    chunks = list(ParquetExport(pg_store.engine, ExecutionFilter(), rows="trajectory", limit=100, page=1,
                                memory_bytes=8 * 4000, chunk_bytes=1 << 30).open())
    assert len(chunks) > 3
    f = pq.ParquetFile(io.BytesIO(b"".join(chunks)))
    assert f.metadata.num_row_groups == len(chunks) - 1
    assert f.metadata.num_rows == sum(len(w.leaves()) for w in writers)


@pytest.fixture
def parquet_file(client: TestClient, keys: Keys, writers: list[ExecutionWriter], tmp_path: Path) -> Path:
    path = tmp_path / "trajectories.parquet"
    path.write_bytes(export(client, keys))
    return path


def _expected_tokens(writers: list[ExecutionWriter]) -> int:
    return sum(v["tokens"].size for w in writers for v in expected_rows(w).values())


def test_pandas_reads_the_export(parquet_file: Path, writers: list[ExecutionWriter]) -> None:
    pd = pytest.importorskip("pandas")
    df = pd.read_parquet(parquet_file)
    assert len(df) == sum(len(w.leaves()) for w in writers)
    assert int(df["token_ids"].map(len).sum()) == _expected_tokens(writers)
    assert set(df["status"]) == {"success", "timeout"}


def test_polars_reads_the_export(parquet_file: Path, writers: list[ExecutionWriter]) -> None:
    pl = pytest.importorskip("polars")
    df = pl.read_parquet(parquet_file)
    assert df["token_ids"].list.len().sum() == _expected_tokens(writers)
    assert df["logprobs"].dtype == pl.List(pl.Float32)
    assert df["roles"].dtype == pl.List(pl.Int8)


def test_duckdb_reads_the_export(parquet_file: Path, writers: list[ExecutionWriter]) -> None:
    duckdb = pytest.importorskip("duckdb")
    con = duckdb.connect()
    src = f"read_parquet('{parquet_file}')"
    query = f"SELECT count(*), sum(len(token_ids)), sum(n_trainable) FROM {src}"
    [(n, tokens, trainable)] = con.execute(query).fetchall()
    assert n == sum(len(w.leaves()) for w in writers)
    assert tokens == _expected_tokens(writers)
    [(nulls,)] = con.execute(f"SELECT count(*) FROM (SELECT unnest(logprobs) AS lp FROM {src}) WHERE lp IS NOT NULL"
                             ).fetchall()
    assert nulls == trainable  # a log-prob exactly for every action/summary token


def test_arrow_schema_types() -> None:
    assert TRAJECTORY_SCHEMA.field("token_ids").type == pa.list_(pa.field("item", pa.int32(), nullable=False))
    assert TRAJECTORY_SCHEMA.field("logprobs").type.value_type == pa.float32()
