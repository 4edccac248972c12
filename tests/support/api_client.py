"""Helpers shared by the API tests: keys, clients, small synthetic
executions and what their writers say they contain."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from sapwood.api import ApiSettings, create_app
from sapwood.api.auth import create_key
from sapwood.platform.events import ModelCall, PartialScore
from sapwood.platform.store import Store
from sapwood.platform.synthetic import SynthConfig, synthetic_execution
from sapwood.platform.writer import ExecutionWriter

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # starlette's TestClient warns that it prefers httpx2
    from fastapi.testclient import TestClient

__all__ = ["Keys", "TestClient", "load_executions", "make_client", "make_keys"]


@dataclass
class Keys:
    """One key per scope set (full keys as sent by clients)."""

    read: str
    write: str
    admin: str
    all: str

    def headers(self, scope: str = "all") -> dict[str, str]:
        return {"Authorization": f"Bearer {getattr(self, scope)}"}


def make_keys(store: Store) -> Keys:
    with store.transaction() as conn:
        return Keys(read=create_key(conn, "reader", "read")[0], write=create_key(conn, "writer", "write")[0],
                    admin=create_key(conn, "admin", "admin")[0], all=create_key(conn, "all", "read write admin")[0])


def make_client(store: Store, **settings: object) -> TestClient:
    app = create_app(ApiSettings(**settings), store=store)  # type: ignore[arg-type]
    return TestClient(app, raise_server_exceptions=False)


def small_config(seed: int, *, status: str = "success", calls: int = 12) -> SynthConfig:
    """A few dozen calls, 2 forks, 3 compaction segments, short token runs (fast to load)."""
    return SynthConfig(calls=calls, forks=2, fork_depth=2, segments=3, obs_min=5, obs_max=40, out_min=3, out_max=20,
                       system_tokens=40, task_tokens=12, template_tokens=3, summary_tokens=8, status=status, seed=seed)


def load_executions(store: Store, n: int, *, run_id: str = "rollout-a", first_seed: int = 0) -> list[ExecutionWriter]:
    """Apply ``n`` small executions (every second one timed out with a partial score) and return their writers."""
    writers = []
    for i in range(n):
        status = "timeout" if i % 2 else "success"
        w = synthetic_execution(small_config(first_seed + i, status=status), run_id=run_id,
                                task_id=f"task-{i % 3}")
        store.apply(w.events)
        writers.append(w)
    return writers


def calls_of(w: ExecutionWriter) -> list[ModelCall]:
    return [e for e in w.events if isinstance(e, ModelCall)]


def recorded_input(w: ExecutionWriter, call: ModelCall) -> np.ndarray:
    """The exact input the producer recorded: context(parent) + appended."""
    parts = [w.context(call.parent)] if call.parent else []
    return np.concatenate([*parts, call.appended]).astype(np.int32)


def latest_score(w: ExecutionWriter) -> float | None:
    scores = [e.score for e in w.events if isinstance(e, PartialScore)]
    return scores[-1] if scores else None


@dataclass
class Segmented:
    """A leaf's logical trajectory as the writer built it."""

    tokens: np.ndarray
    segment_starts: list[int]


def logical_trajectory(w: ExecutionWriter, leaf: str) -> Segmented:
    """Concatenated segment contexts ending at ``leaf`` (segment roots continue the summary they compact)."""
    from sapwood.platform.events import SegmentBoundary

    continues = {e.root_node_id: e.from_node for e in w.events if isinstance(e, SegmentBoundary)}
    contexts = []
    node: str | None = leaf
    while node is not None:
        # walk to this context's root
        cur = node
        while w.nodes[cur].parent is not None:
            cur = w.nodes[cur].parent  # type: ignore[assignment]
        contexts.append(w.context(node))
        node = continues.get(cur)
    contexts.reverse()
    starts = list(np.cumsum([0] + [c.size for c in contexts[:-1]]).tolist())
    return Segmented(np.concatenate(contexts), starts)


class HexTokenizer:
    """A test tokenizer loaded through SAPWOOD_TOKENIZER's dotted-path form."""

    def decode(self, ids: list[int]) -> str:
        return " ".join(f"{i:x}" for i in ids)


def hex_tokenizer() -> HexTokenizer:
    return HexTokenizer()
