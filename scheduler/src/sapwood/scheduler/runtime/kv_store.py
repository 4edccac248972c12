"""A cell's per-execution KV cache: one entry per live execution (session), LRU-evicted by bytes.

An entry holds the past keys/values of the tokens an execution's calls fed to the model on this cell,
under one policy version. The next call of the same execution whose input extends those tokens
(the agent loop appends the observation to the previous prompt + output) feeds only the new suffix.
An entry computed on other weights, or whose tokens are not a prefix of the new input, is not used.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from sapwood.learner.model import KVCache
from sapwood.rollout.torch_engine import kv_cache_bytes

__all__ = ["KVEntry", "KVStore"]


@dataclass
class KVEntry:
    """KV of one execution on one cell."""

    tokens: tuple[int, ...]
    """The token ids the cache covers (positions ``0..n-1``)."""
    version: int
    """Policy version of the weights that computed it."""
    past: KVCache
    """Per layer ``(k, v)``, each [heads, n, head_dim]."""
    logits: Any = None
    """[V] next-token logits after ``tokens`` when known (a prefill or import stores them), else None."""

    @property
    def nbytes(self) -> int:
        return kv_cache_bytes(self.past)

    def reusable_for(self, input_ids: list[int], version: int) -> bool:
        """True when this entry can start a call on ``input_ids`` under ``version``: same weights, its
        tokens a prefix of the input, and at least one token left to feed (or the logits known)."""
        n = len(self.tokens)
        if self.version != version or n > len(input_ids) or tuple(input_ids[:n]) != self.tokens:
            return False
        return n < len(input_ids) or self.logits is not None


class KVStore:
    """LRU of ``KVEntry`` by session key, bounded by ``max_bytes`` (thread-safe). An entry in use by a
    call is taken out (:meth:`take`) and put back when the call ends (:meth:`put`)."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError(f"KV cache budget must be ≥ 0 bytes, got {max_bytes}")
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, KVEntry] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.evictions = 0

    def put(self, session: str, entry: KVEntry) -> list[str]:
        """Store ``entry`` as the most recently used; evict least recently used entries until the total fits
        (an entry larger than the whole budget is not kept). Returns the evicted sessions."""
        size = entry.nbytes
        evicted: list[str] = []
        with self._lock:
            old = self._entries.pop(session, None)
            if old is not None:
                self._bytes -= old.nbytes
            if size > self.max_bytes:
                return [session]
            while self._entries and self._bytes + size > self.max_bytes:
                key, gone = self._entries.popitem(last=False)
                self._bytes -= gone.nbytes
                evicted.append(key)
            self._entries[session] = entry
            self._bytes += size
            self.evictions += len(evicted)
        return evicted

    def take(self, session: str) -> KVEntry | None:
        """Remove and return the entry of ``session`` (None when absent)."""
        with self._lock:
            entry = self._entries.pop(session, None)
            if entry is not None:
                self._bytes -= entry.nbytes
            return entry

    def peek(self, session: str) -> KVEntry | None:
        with self._lock:
            return self._entries.get(session)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"kv_sessions": len(self._entries), "kv_bytes": self._bytes, "kv_evictions": self.evictions}
