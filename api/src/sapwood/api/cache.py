"""A byte-bounded LRU of serialized responses.

Only immutable results are cached: an audit (model calls and spans never change once
stored) and a tree keyed by its execution's ``last_seq`` (every change to an execution —
new node, fork, finish, score revision — is an event that bumps ``last_seq``), so an entry
can never be stale. One cache per worker process; concurrent misses on one key are merged
(``inflight``, used on the event loop by :func:`sapwood.api.routes.cached`).
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

#: A cached response: body and the headers that go with it.
Cached = tuple[bytes, dict[str, str]]


class ResponseCache:
    """Thread-safe LRU: key → (body bytes, headers), holding at most ``max_bytes`` of bodies."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[Hashable, Cached] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        #: key → the build in progress (its future), so concurrent misses wait for one build.
        self.inflight: dict[Hashable, asyncio.Future[Cached]] = {}

    def get(self, key: Hashable) -> Cached | None:
        with self._lock:
            value = self._items.get(key)
            if value is None:
                self.misses += 1
                return None
            self._items.move_to_end(key)
            self.hits += 1
            return value

    def put(self, key: Hashable, value: Cached) -> None:
        size = len(value[0])
        if size > self.max_bytes // 4:  # one response never takes over the cache
            return
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._bytes -= len(old[0])
            self._items[key] = value
            self._bytes += size
            while self._bytes > self.max_bytes and self._items:
                _, evicted = self._items.popitem(last=False)
                self._bytes -= len(evicted[0])

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._bytes = 0

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._items)


class LRU(Generic[K, V]):
    """Thread-safe LRU of at most ``max_items`` immutable values (e.g. a node's path to its root)."""

    def __init__(self, max_items: int) -> None:
        self.max_items = max_items
        self._items: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def put(self, key: K, value: V) -> None:
        if self.max_items <= 0:
            return
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.max_items:
                self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)
