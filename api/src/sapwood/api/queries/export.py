"""Parquet export of executions, one row per trajectory or per node, streamed row group by row group.

Both schemas carry a ``description`` in every field's metadata; :func:`describe_schema` renders them.

**Trajectory rows** (``rows=trajectory``): one row per leaf, i.e. per root-to-leaf path across
compaction segments. ``token_ids``/``roles``/``logprobs``/``policy_versions`` are aligned
per-token lists over the concatenated segment contexts; ``segment_starts`` gives the index in
``token_ids`` where each segment's context begins. Shared prefixes are repeated per row (it is
an export for training tools, not the store's layout).

**Node rows** (``rows=node``): one row per tree node, prefixes stored once; rebuild a
context by following ``parent_id`` (and ``prev_segment_node`` across segments).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from sqlalchemy.engine import Connection, Engine

from sapwood.api.queries.trees import TRAINABLE, TreeNode, load_nodes, reward_fields
from sapwood.platform.execution_filter import ExecutionFilter
from sapwood.platform.storage.backends import tree_reader
from sapwood.platform.storage.errors import translate_errors
from sapwood.platform.storage.executions import executions_page
from sapwood.platform.tokens import LOGPROB_DTYPE, TOKEN_DTYPE
from sapwood.platform.tree import ROLE_NAMES

ExportRows = Literal["trajectory", "node"]


def _f(name: str, typ: pa.DataType, description: str, nullable: bool = False) -> pa.Field:
    return pa.field(name, typ, nullable=nullable, metadata={"description": description})


_EXEC_FIELDS = [
    _f("execution_id", pa.string(), "execution (one attempt at one task), UUID"),
    _f("run_id", pa.string(), "run the execution was recorded under"),
    _f("task_id", pa.string(), "task"),
    _f("task_family", pa.string(), "task family, e.g. swe or math"),
    _f("status", pa.string(), "success / timeout / error / running"),
]

TRAJECTORY_SCHEMA = pa.schema([
    *_EXEC_FIELDS,
    _f("leaf_node_id", pa.string(), "last node of the trajectory"),
    _f("reward", pa.float64(), "the reward the learner trains on (default reward policy); null: left out of "
       "training (an error or running execution)", nullable=True),
    _f("score", pa.float64(), "latest partial score of the execution", nullable=True),
    _f("final_reward", pa.float64(), "the execution's recorded final reward", nullable=True),
    _f("reward_source", pa.string(), "where `reward` came from: leaf / final / partial_score / missing / "
       "zero: timeout / excluded: error / excluded: running"),
    _f("n_segments", pa.int32(), "compaction segments the trajectory spans"),
    _f("n_tokens", pa.int64(), "length of token_ids"),
    _f("n_trainable", pa.int64(), "action and summary tokens (roles 2 and 3)"),
    _f("max_policy_version", pa.int32(), "newest policy version that served a call of the execution", nullable=True),
    _f("started_at", pa.float64(), "unix seconds"),
    _f("finished_at", pa.float64(), "unix seconds", nullable=True),
    _f("token_ids", pa.list_(pa.field("item", pa.int32(), nullable=False)),
       "token ids of all segment contexts, concatenated in segment order"),
    _f("roles", pa.list_(pa.field("item", pa.int8(), nullable=False)),
       "per token: 0 prompt, 1 observation, 2 action, 3 summary"),
    _f("logprobs", pa.list_(pa.float32()), "per token: rollout log-prob for action/summary tokens, null otherwise"),
    _f("policy_versions", pa.list_(pa.int32()), "per token: policy version of the producing call, null otherwise"),
    _f("segment_starts", pa.list_(pa.field("item", pa.int64(), nullable=False)),
       "index in token_ids where each segment's context begins"),
])

NODE_SCHEMA = pa.schema([
    *_EXEC_FIELDS,
    _f("node_id", pa.string(), "tree node, UUID"),
    _f("parent_id", pa.string(), "previous node of the same context; null for a segment root", nullable=True),
    _f("prev_segment_node", pa.string(), "for a segment root: the summary node it continues", nullable=True),
    _f("segment", pa.int32(), "compaction segment"),
    _f("role", pa.int8(), "0 prompt, 1 observation, 2 action, 3 summary"),
    _f("role_name", pa.string(), "prompt / observation / action / summary"),
    _f("depth", pa.int64(), "offset of the node's first token in its context"),
    _f("level", pa.int32(), "tree level (segment roots one below the summary they continue)"),
    _f("length", pa.int32(), "tokens in the node"),
    _f("is_leaf", pa.bool_(), "no child and not continued by a later segment"),
    _f("fork_branches", pa.int32(), "branches declared by a fork event at the node (0 = none)"),
    _f("call_id", pa.string(), "model call that produced the node (actions and summaries)", nullable=True),
    _f("policy_version", pa.int32(), "policy version of that call", nullable=True),
    _f("token_ids", pa.list_(pa.field("item", pa.int32(), nullable=False)), "the node's token ids"),
    _f("logprobs", pa.list_(pa.field("item", pa.float32(), nullable=False)),
       "rollout log-probs of the node's tokens (actions and summaries; null for other nodes)", nullable=True),
])


def describe_schema(schema: pa.Schema) -> list[dict[str, str]]:
    """``[{name, type, description}]`` of an export schema (used in the API docs)."""
    return [{"name": f.name, "type": str(f.type),
             "description": (f.metadata or {}).get(b"description", b"").decode()} for f in schema]


class _Sink:
    """Write-only file object whose bytes are drained after every row group."""

    def __init__(self) -> None:
        self._chunks: list[bytes] = []
        self._pos = 0
        self.closed = False

    def write(self, data: Any) -> int:
        b = bytes(data)
        self._chunks.append(b)
        self._pos += len(b)
        return len(b)

    def tell(self) -> int:
        return self._pos

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def drain(self) -> bytes:
        out = b"".join(self._chunks)
        self._chunks.clear()
        return out


class _ExecutionData:
    """Nodes, token spans and log-prob spans of one execution."""

    def __init__(self, conn: Connection, ex: dict[str, Any]) -> None:
        self.ex = ex
        eid = ex["execution_id"]
        self.nodes = load_nodes(conn, eid)
        self.index = {n.node_id: n for n in self.nodes}
        self.tokens, self.logprobs = tree_reader(conn).execution_spans(conn, eid)

    def path(self, leaf: TreeNode) -> list[TreeNode]:
        out = []
        cur: TreeNode | None = leaf
        while cur is not None:
            out.append(cur)
            cur = self.index.get(cur.up) if cur.up else None
        return out[::-1]


_Lists = dict[str, tuple[np.ndarray, np.ndarray | None] | None]
"""Per list column: (values, null mask or None), or None for a null list."""
_Row = tuple[dict[str, Any], _Lists, int]
"""(scalar columns, list columns, tokens in the row)."""
_SCALAR_BYTES = 64
"""Estimated bytes of one buffered scalar value (a Python object and its list slot)."""


class _Columns:
    """Row-group buffer: scalar columns plus flat per-token values with list offsets."""

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema
        self.scalars: dict[str, list[Any]] = {f.name: [] for f in schema if not pa.types.is_list(f.type)}
        self.lists: dict[str, list[np.ndarray]] = {f.name: [] for f in schema if pa.types.is_list(f.type)}
        self.masks: dict[str, list[np.ndarray]] = {}
        self.offsets: dict[str, list[int]] = {name: [0] for name in self.lists}
        self.null_lists: dict[str, list[bool]] = {name: [] for name in self.lists}
        self.tokens = 0
        self.rows = 0
        self.nbytes = 0
        """Bytes of the buffered per-token values and masks (what a flush copies into Arrow)."""

    def add(self, scalars: dict[str, Any], lists: _Lists, n_tokens: int) -> None:
        for k, v in scalars.items():
            self.scalars[k].append(v)
        self.nbytes += _SCALAR_BYTES * len(scalars)
        for name, item in lists.items():
            if item is None:
                self.null_lists[name].append(True)
                self.offsets[name].append(self.offsets[name][-1])
                continue
            values, mask = item
            self.null_lists[name].append(False)
            self.lists[name].append(values)
            if mask is not None:
                self.masks.setdefault(name, []).append(mask)
            elif name in self.masks or self._maskable(name):
                self.masks.setdefault(name, []).append(np.zeros(values.size, dtype=bool))
            self.offsets[name].append(self.offsets[name][-1] + int(values.size))
            self.nbytes += values.nbytes + (values.size if mask is not None or name in self.masks else 0)
        self.tokens += n_tokens
        self.rows += 1

    def _maskable(self, name: str) -> bool:
        return bool(self.schema.field(name).type.value_field.nullable)

    def table(self) -> pa.Table:
        arrays = []
        for f in self.schema:
            if f.name in self.scalars:
                arrays.append(pa.array(self.scalars[f.name], type=f.type))
                continue
            value_type = f.type.value_type
            parts = self.lists[f.name]
            flat = np.concatenate(parts) if parts else np.zeros(0, dtype=value_type.to_pandas_dtype())
            mask = None
            if self.masks.get(f.name):
                mask = np.concatenate(self.masks[f.name])
            values = pa.array(flat, type=value_type, mask=mask if mask is not None and mask.any() else None)
            offsets = pa.array(self.offsets[f.name], type=pa.int32())
            nulls = self.null_lists[f.name]
            arr = pa.ListArray.from_arrays(offsets, values, type=f.type,
                                           mask=pa.array(nulls, type=pa.bool_()) if any(nulls) else None)
            arrays.append(arr)
        return pa.Table.from_arrays(arrays, schema=self.schema)


def _exec_scalars(ex: dict[str, Any]) -> dict[str, Any]:
    return {"execution_id": ex["execution_id"], "run_id": ex["run_id"], "task_id": ex["task_id"],
            "task_family": ex["task_family"], "status": ex["status"]}


def _trained_reward(ex: dict[str, Any], leaf_id: str) -> dict[str, Any]:
    got = reward_fields({**ex, "leaf_rewards": ex.get("leaf_rewards") or {}}, leaf_id)
    return {"reward": got["reward"], "score": got["latest_score"], "final_reward": got["final_reward"],
            "reward_source": got["reward_source"]}


def _trajectory_rows(data: _ExecutionData) -> Iterator[_Row]:
    """One row per leaf, built when asked for (so that the caller can flush between rows)."""
    ex = data.ex
    for leaf in (n for n in data.nodes if n.is_leaf):
        path = data.path(leaf)
        tokens = [data.tokens[n.node_id] for n in path]
        lengths = np.array([x.size for x in tokens], dtype=np.int64)
        ids = np.concatenate(tokens) if tokens else np.zeros(0, dtype=TOKEN_DTYPE)
        roles = np.repeat(np.array([n.role for n in path], dtype=np.int8), lengths)
        lps = np.zeros(ids.size, dtype=LOGPROB_DTYPE)
        lp_mask = np.ones(ids.size, dtype=bool)
        versions = np.repeat(np.array([n.policy_version or 0 for n in path], dtype=np.int32), lengths)
        pos = 0
        starts = []
        for n, size in zip(path, lengths.tolist(), strict=True):
            if n.parent_id is None:
                starts.append(pos)
            lp = data.logprobs.get(n.node_id)
            if lp is not None and n.role in TRAINABLE:
                lps[pos:pos + size] = lp
                lp_mask[pos:pos + size] = False
            pos += size
        v_mask = ~np.isin(roles, TRAINABLE) | np.repeat(np.array([n.policy_version is None for n in path]), lengths)
        yield (
            {**_exec_scalars(ex), "leaf_node_id": leaf.node_id,
             **_trained_reward(ex, leaf.node_id), "n_segments": len(starts), "n_tokens": int(ids.size),
             "n_trainable": int(np.isin(roles, TRAINABLE).sum()), "max_policy_version": ex["max_policy_version"],
             "started_at": ex["started_at"], "finished_at": ex["finished_at"]},
            {"token_ids": (ids, None), "roles": (roles, None), "logprobs": (lps, lp_mask),
             "policy_versions": (versions, v_mask), "segment_starts": (np.array(starts, dtype=np.int64), None)},
            int(ids.size),
        )


def _node_rows(data: _ExecutionData) -> Iterator[_Row]:
    """One row per node."""
    for n in data.nodes:
        lp = data.logprobs.get(n.node_id) if n.role in TRAINABLE else None
        yield (
            {**_exec_scalars(data.ex), "node_id": n.node_id, "parent_id": n.parent_id,
             "prev_segment_node": n.prev_segment_node, "segment": n.segment, "role": n.role,
             "role_name": ROLE_NAMES[n.role], "depth": n.depth, "level": n.level, "length": n.length,
             "is_leaf": n.is_leaf, "fork_branches": n.fork_branches, "call_id": n.call_id,
             "policy_version": n.policy_version},
            {"token_ids": (data.tokens[n.node_id], None), "logprobs": None if lp is None else (lp, None)},
            n.length,
        )


class ParquetExport:
    """One export as an iterator of byte chunks, in memory bounded by ``memory_bytes``.

    :meth:`open` runs the first query eagerly, so a bad filter or an unavailable store fails the
    request before any byte is sent. Iterating reads one execution at a time, each with its own
    short-lived connection of ``engine`` (none is held while a chunk waits for the client), and
    writes a Parquet row group whenever the buffered rows reach ``memory_bytes // 4`` (the buffer,
    its concatenation, the encoded row group and the compressed bytes each take at most about that).
    Chunks are at most ``chunk_bytes`` long, so a client that stops reading holds little in the
    server's send buffer. Beyond ``memory_bytes``, one export holds one execution's stored token
    and log-prob arrays and one trajectory row (a row is never split).
    """

    def __init__(self, engine: Engine, flt: ExecutionFilter, *, rows: ExportRows, limit: int,
                 page: int = 20, memory_bytes: int = 64 << 20, chunk_bytes: int = 64 << 10) -> None:
        self.engine = engine
        self.flt = flt
        self.rows = rows
        self.limit = limit
        self.page = page
        self.row_group_bytes = max(1, memory_bytes // 8)
        self.chunk_bytes = chunk_bytes
        self.schema = TRAJECTORY_SCHEMA if rows == "trajectory" else NODE_SCHEMA
        self._first: list[dict[str, Any]] | None = None

    def open(self) -> ParquetExport:
        self._first = self._page(None)
        return self

    def _page(self, after: tuple[float, str] | None) -> list[dict[str, Any]]:
        with translate_errors(), self.engine.connect() as conn:
            return [dict(r) for r in executions_page(conn, self.flt, after=after, limit=self.page)]

    def _read(self, ex: dict[str, Any]) -> _ExecutionData:
        with translate_errors(), self.engine.connect() as conn:
            return _ExecutionData(conn, ex)

    def _executions(self) -> Iterator[_ExecutionData]:
        page = self._first if self._first is not None else self._page(None)
        done = 0
        while page and done < self.limit:
            for ex in page[: self.limit - done]:
                yield self._read(ex)
                done += 1
            last = page[-1]
            page = self._page((last["started_at"], last["execution_id"])) if done < self.limit else []

    def _slices(self, data: bytes) -> Iterator[bytes]:
        view = memoryview(data)
        for start in range(0, len(view), self.chunk_bytes):
            yield bytes(view[start:start + self.chunk_bytes])

    def __iter__(self) -> Iterator[bytes]:
        sink = _Sink()
        with translate_errors():
            writer = pq.ParquetWriter(sink, self.schema, compression="zstd", use_dictionary=_DICTIONARY_COLUMNS)
        buf = _Columns(self.schema)
        add_rows = _trajectory_rows if self.rows == "trajectory" else _node_rows
        written = False
        for data in self._executions():
            for row in add_rows(data):
                buf.add(*row)
                if buf.nbytes >= self.row_group_bytes:
                    writer.write_table(buf.table())
                    buf = _Columns(self.schema)
                    written = True
                    yield from self._slices(sink.drain())
            del data
        if buf.rows or not written:
            writer.write_table(buf.table())
        del buf
        writer.close()
        yield from self._slices(sink.drain())


_DICTIONARY_COLUMNS = [f.name for f in (*TRAJECTORY_SCHEMA, *NODE_SCHEMA) if pa.types.is_string(f.type)]
"""Dictionary-encoded columns: the repeated strings (a dictionary over token ids only costs memory)."""
