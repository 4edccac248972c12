"""Where a proxied call sits in its session's tree, decided from token ids alone (never from text).

A call's *context* is its prompt ids followed by its output ids. For a new call's prompt ``p``:

1. ``next``: ``p`` starts with the last call's context -> the next call of the chain.
2. ``segment`` with a summary: ``p`` does not start with the last context but contains the last call's
   (non-empty) output ids as a contiguous run -> the harness compacted; a new segment whose summary is
   the last call's output.
3. ``fork``: otherwise, if ``p`` shares a non-empty prefix with some earlier context -> a fork of the
   call with the longest shared prefix (the latest such call on ties), at that prefix length. A prompt
   that extends an earlier, not-last context entirely is a fork at that context's end.
4. ``segment`` without a summary: nothing shared -> a new segment.
The first call of a session is ``root``.

Contexts are kept as int64 arrays (8 bytes per token, compared with numpy, not a Python loop).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import numpy.typing as npt

Ids = Sequence[int] | npt.NDArray[np.int64]

PlacementKind = Literal["root", "next", "fork", "segment"]


@dataclass(frozen=True)
class Placement:
    """``parent``: index of the call this one continues or forks (None for root/segment);
    ``prefix_len``: prompt tokens shared with the parent's context; ``summary_of``: index of the call
    whose output the new segment's prompt contains (None when not a compaction)."""

    kind: PlacementKind
    parent: int | None
    prefix_len: int
    summary_of: int | None = None


def as_ids(ids: Ids) -> npt.NDArray[np.int64]:
    """Token ids [n] as an int64 array (no copy when they already are one)."""
    return np.asarray(ids, dtype=np.int64)


def common_prefix_len(a: Ids, b: Ids) -> int:
    """Number of leading positions where ``a`` and ``b`` hold the same id."""
    x, y = as_ids(a), as_ids(b)
    n = min(len(x), len(y))
    differ = np.flatnonzero(x[:n] != y[:n])
    return int(differ[0]) if len(differ) else n


def contains_run(haystack: Ids, needle: Ids) -> bool:
    """Whether ``needle`` occurs in ``haystack`` as a contiguous run of ids (a byte search, 8-byte aligned)."""
    h, n = as_ids(haystack).tobytes(), as_ids(needle).tobytes()
    if not n:
        return False
    at = h.find(n)
    while at != -1 and at % 8:
        at = h.find(n, at + 1)
    return at != -1


@dataclass
class SessionTree:
    """The contexts of one session's calls, in arrival order, and the rules above."""

    contexts: list[npt.NDArray[np.int64]] = field(default_factory=list)
    outputs: list[npt.NDArray[np.int64]] = field(default_factory=list)

    def place(self, prompt_ids: Ids) -> Placement:
        """Where a call with these prompt ids goes (does not record it)."""
        if not self.contexts:
            return Placement("root", None, 0)
        prompt_ids = as_ids(prompt_ids)
        last = len(self.contexts) - 1
        last_ctx = self.contexts[last]
        if len(prompt_ids) >= len(last_ctx) and np.array_equal(prompt_ids[: len(last_ctx)], last_ctx):
            return Placement("next", last, len(last_ctx))
        if contains_run(prompt_ids, self.outputs[last]):
            return Placement("segment", None, 0, summary_of=last)
        best, best_len = None, 0
        for i, ctx in enumerate(self.contexts):
            shared = common_prefix_len(prompt_ids, ctx)
            if shared > 0 and shared >= best_len:
                best, best_len = i, shared
        if best is not None:
            return Placement("fork", best, best_len)
        return Placement("segment", None, 0)

    def add(self, prompt_ids: Ids, output_ids: Ids) -> Placement:
        """Place the call, then remember its context."""
        placement = self.place(prompt_ids)
        output = as_ids(output_ids)
        self.contexts.append(np.concatenate([as_ids(prompt_ids), output]))
        self.outputs.append(output)
        return placement
