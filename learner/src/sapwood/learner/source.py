"""Batch source: Jmax-bounded trajectory-tree batches from the store, exactly once per run.

A learner claims finished executions of its run (``sapwood.platform.runs``), selects at
most Jmax leaves (trajectories) per execution, and turns the union of their root-to-leaf
paths — across compaction segments — into one :class:`TreeBatch` of unique tokens. Token
arrays are assembled with numpy over whole nodes (no Python loop per token).
"""

from __future__ import annotations

import hashlib
import threading
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import torch
from sqlalchemy.engine import Connection

from sapwood.learner.batch import TreeBatch
from sapwood.platform import runs
from sapwood.platform.spans import load_spans
from sapwood.platform.storage.trees import BatchNode, tree_reader
from sapwood.platform.store import Store
from sapwood.platform.tokens import LOGPROB_DTYPE, TOKEN_DTYPE
from sapwood.platform.tree import RewardPolicy, Role, logical_parent, resolve_reward

__all__ = ["BatchSource", "ClaimedBatch", "RewardPolicy", "SourceConfig", "build_batch"]


@dataclass
class SourceConfig:
    """What a batch source claims and how it builds batches."""

    jmax: int = 8
    """At most this many trajectories (leaves) per execution; chosen uniformly with a seed."""
    executions_per_batch: int = 4
    """Executions claimed per batch."""
    lease_s: float = 600.0
    """Claim lease; a crashed learner's executions are claimable again after it."""
    poll_s: float = 0.2
    """Wait between claim attempts when the run has nothing pending."""
    seed: int = 0
    """Seed of the Jmax selection."""
    reward: RewardPolicy = field(default_factory=RewardPolicy)
    """Reward policy (``sapwood.platform.tree``; the API shows rewards under its default)."""
    train_summaries: bool = True
    """False freezes the summarizer: summary tokens stay in context but are not trainable."""


@dataclass
class ClaimedBatch:
    """A batch and the claims behind it: ``complete()`` after training, ``release()`` on failure."""

    batch: TreeBatch
    execution_ids: list[str]
    skipped: list[str]
    assembly_s: float
    _source: BatchSource

    def renew(self) -> bool:
        """Extend the lease; False if another learner took any of these executions over."""
        return self._source.renew(self.execution_ids)

    def complete(self) -> list[str]:
        """Mark the executions done for this run; return those this learner no longer held."""
        return self._source.complete(self.execution_ids + self.skipped)

    def release(self) -> None:
        self._source.release(self.execution_ids)


class BatchSource:
    """Claims and assembles batches of ``run_id`` for learner ``learner_id``."""

    def __init__(
        self,
        store: Store,
        run_id: str,
        *,
        learner_id: str | None = None,
        config: SourceConfig | None = None,
        prefetch: bool = False,
    ) -> None:
        self.store = store
        self.run_id = run_id
        self.learner_id = learner_id or f"learner-{uuid.uuid4().hex[:8]}"
        self.config = config or SourceConfig()
        with store.transaction() as conn:
            self.run = runs.get_run(conn, run_id)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="batch-prefetch") if prefetch else None
        self._pending: Future[ClaimedBatch | None] | None = None
        self._lock = threading.Lock()

    # -- claims ------------------------------------------------------------------------------------
    def _claim(self) -> list[str]:
        with self.store.transaction() as conn:
            if self.run["kind"] == "live":
                runs.sync_run(conn, self.run_id)
            return runs.claim(
                conn, self.run_id, self.learner_id, self.config.executions_per_batch, lease_s=self.config.lease_s
            )

    def renew(self, execution_ids: list[str]) -> bool:
        """Extend the lease of ``execution_ids``; False if this learner no longer holds every one."""
        with self.store.transaction() as conn:
            n = runs.renew(conn, self.run_id, self.learner_id, execution_ids, lease_s=self.config.lease_s)
        return n == len(execution_ids)

    def complete(self, execution_ids: list[str]) -> list[str]:
        with self.store.transaction() as conn:
            return runs.complete(conn, self.run_id, self.learner_id, execution_ids)

    def release(self, execution_ids: list[str]) -> None:
        with self.store.transaction() as conn:
            runs.release(conn, self.run_id, self.learner_id, execution_ids)

    # -- batches -----------------------------------------------------------------------------------
    def try_batch(self) -> ClaimedBatch | None:
        """Claim and assemble one batch now, or None if the run has nothing pending."""
        ids = self._claim()
        if not ids:
            return None
        t0 = time.perf_counter()
        try:
            batch, used = build_batch(self.store, ids, self.config)
        except Exception:
            self.release(ids)
            raise
        skipped = [e for e in ids if e not in used]
        if not used:  # everything claimed was excluded by the reward policy
            self.complete(skipped)
            return self.try_batch()
        return ClaimedBatch(batch, used, skipped, time.perf_counter() - t0, self)

    def next_batch(self, timeout_s: float = 0.0) -> ClaimedBatch | None:
        """The next batch, waiting up to ``timeout_s`` for executions to finish; None if none came.

        With ``prefetch`` the following batch is assembled in the background while the caller trains.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            got = self._take_prefetched() if self._pool else self.try_batch()
            if got is not None:
                if self._pool is not None:
                    self._pending = self._pool.submit(self.try_batch)
                return got
            if time.monotonic() >= deadline:
                return None
            time.sleep(self.config.poll_s)

    def _take_prefetched(self) -> ClaimedBatch | None:
        with self._lock:
            fut, self._pending = self._pending, None
        if fut is None:
            return self.try_batch()
        return fut.result()

    def close(self) -> None:
        """Stop prefetching and give back a prefetched, untrained batch."""
        if self._pool is None:
            return
        fut, self._pending = self._pending, None
        if fut is not None:
            leftover = fut.result()
            if leftover is not None:
                leftover.release()
        self._pool.shutdown(wait=True)


# -- assembly --------------------------------------------------------------------------------------
def _select_leaves(leaves: list[str], jmax: int, seed: int) -> list[str]:
    if len(leaves) <= jmax:
        return leaves
    key = {leaf: hashlib.blake2b(f"{seed}:{leaf}".encode(), digest_size=8).digest() for leaf in leaves}
    return sorted(leaves, key=key.__getitem__)[:jmax]


def build_batch(store: Store, execution_ids: list[str], config: SourceConfig) -> tuple[TreeBatch, list[str]]:
    """Assemble the Jmax-bounded subtrees of ``execution_ids``; return the batch and the ids it holds."""
    with store.transaction() as conn:
        return _build(conn, execution_ids, config)


def _build(conn: Connection, execution_ids: list[str], config: SourceConfig) -> tuple[TreeBatch, list[str]]:
    rows = tree_reader(conn).batch_rows(conn, execution_ids)
    ex_rows, by_exec, lp_digest = rows.executions, rows.nodes, rows.logprob_digests

    chosen: list[BatchNode] = []  # selected node rows, per execution in topological order
    exec_index: list[int] = []
    leaf_reward_of: dict[str, float] = {}
    used: list[str] = []
    families: list[str] = []
    for eid in execution_ids:
        ex = ex_rows.get(eid)
        if ex is None or eid not in by_exec:
            continue
        if resolve_reward(ex.status, ex.reward, ex.score, policy=config.reward).reward is None:
            continue
        nodes = {r.node_id: r for r in by_exec[eid]}
        leaves = _select_leaves(sorted(n for n, r in nodes.items() if r.is_leaf), config.jmax, config.seed)
        keep: set[str] = set()
        for leaf in leaves:
            cur: str | None = leaf
            while cur is not None and cur not in keep:
                keep.add(cur)
                row = nodes[cur]
                cur = logical_parent(row.parent_id, row.prev_segment_node)
            resolved = resolve_reward(ex.status, ex.reward, ex.score, ex.leaf_rewards, leaf, policy=config.reward)
            assert resolved.reward is not None  # the execution is not excluded, so neither is its leaf
            leaf_reward_of[leaf] = resolved.reward
        ordered = sorted((nodes[n] for n in keep), key=lambda r: (r.segment, r.depth, r.node_id))
        chosen.extend(ordered)
        exec_index.extend([len(used)] * len(ordered))
        used.append(eid)
        families.append(ex.task_family)
    if not chosen:
        return _empty_batch(), []

    digests = {r.span_digest for r in chosen} | {lp_digest[r.call_id] for r in chosen if r.call_id is not None}
    spans = load_spans(conn, digests)
    n = len(chosen)
    lengths = np.fromiter((r.length for r in chosen), dtype=np.int64, count=n)
    starts = np.zeros(n, dtype=np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    ends = starts + lengths - 1
    total = int(lengths.sum())
    index = {r.node_id: i for i, r in enumerate(chosen)}

    tokens = np.frombuffer(b"".join(spans[r.span_digest] for r in chosen), dtype=TOKEN_DTYPE)
    node_of_token = np.repeat(np.arange(n), lengths)
    offset_in_node = np.arange(total) - starts[node_of_token]

    parent_node = np.array([index[r.parent_id] if r.parent_id else -1 for r in chosen], dtype=np.int64)
    first_parent = np.where(parent_node >= 0, ends[parent_node], -1)
    parent = np.arange(total, dtype=np.int64) - 1
    parent[starts] = first_parent

    depth = np.fromiter((r.depth for r in chosen), dtype=np.int64, count=n)
    position = depth[node_of_token] + offset_in_node

    role_node = np.fromiter((r.role for r in chosen), dtype=np.int64, count=n)
    role = role_node[node_of_token]
    trainable_node = (role_node == Role.ACTION) | ((role_node == Role.SUMMARY) & config.train_summaries)
    trainable = trainable_node[node_of_token]

    seg_parent_node = np.array(
        [index[r.prev_segment_node] if r.prev_segment_node else -1 for r in chosen], dtype=np.int64
    )
    segment_parent = np.full(total, -1, dtype=np.int64)
    linked = seg_parent_node >= 0
    segment_parent[starts[linked]] = ends[seg_parent_node[linked]]

    logprob = np.zeros(total, dtype=np.float32)
    out_calls = {i: r.call_id for i, r in enumerate(chosen) if r.call_id is not None}
    out_nodes = list(out_calls)
    if out_nodes:
        lp = np.frombuffer(b"".join(spans[lp_digest[c]] for c in out_calls.values()), dtype=LOGPROB_DTYPE)
        out_idx = np.concatenate([np.arange(starts[i], starts[i] + lengths[i]) for i in out_nodes])
        logprob[out_idx] = lp
    logprob[~trainable] = 0.0

    pv_node = np.array([r.policy_version if r.policy_version is not None else -1 for r in chosen], dtype=np.int64)
    policy_version = pv_node[node_of_token]

    leaf_reward = np.full(total, np.nan, dtype=np.float32)
    for leaf, value in leaf_reward_of.items():
        if leaf in index:
            leaf_reward[ends[index[leaf]]] = value

    batch = TreeBatch(
        tokens=torch.from_numpy(tokens.astype(np.int64)),
        parent=torch.from_numpy(parent),
        position=torch.from_numpy(position),
        role=torch.from_numpy(role),
        trainable=torch.from_numpy(trainable),
        rollout_logprob=torch.from_numpy(logprob),
        policy_version=torch.from_numpy(policy_version),
        execution=torch.from_numpy(np.asarray(exec_index, dtype=np.int64)[node_of_token]),
        segment_parent=torch.from_numpy(segment_parent),
        leaf_reward=torch.from_numpy(leaf_reward),
        task_family=families,
        execution_ids=used,
    )
    return batch, used


def _empty_batch() -> TreeBatch:
    z = torch.zeros(0, dtype=torch.int64)
    return TreeBatch(
        tokens=z,
        parent=z,
        position=z,
        role=z,
        trainable=torch.zeros(0, dtype=torch.bool),
        rollout_logprob=torch.zeros(0),
        policy_version=z,
        execution=z,
        segment_parent=z,
        leaf_reward=torch.zeros(0),
        task_family=[],
        execution_ids=[],
    )
