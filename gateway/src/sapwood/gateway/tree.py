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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

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


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """Number of leading positions where ``a`` and ``b`` hold the same id."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def contains_run(haystack: Sequence[int], needle: Sequence[int]) -> bool:
    """Whether ``needle`` occurs in ``haystack`` as a contiguous run of ids."""
    if not needle:
        return False
    first, n = needle[0], len(needle)
    target = list(needle)
    return any(haystack[i] == first and list(haystack[i : i + n]) == target for i in range(len(haystack) - n + 1))


@dataclass
class SessionTree:
    """The contexts of one session's calls, in arrival order, and the rules above."""

    contexts: list[list[int]] = field(default_factory=list)
    outputs: list[list[int]] = field(default_factory=list)

    def place(self, prompt_ids: Sequence[int]) -> Placement:
        """Where a call with these prompt ids goes (does not record it)."""
        if not self.contexts:
            return Placement("root", None, 0)
        last = len(self.contexts) - 1
        last_ctx = self.contexts[last]
        if len(prompt_ids) >= len(last_ctx) and common_prefix_len(prompt_ids, last_ctx) == len(last_ctx):
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

    def add(self, prompt_ids: Sequence[int], output_ids: Sequence[int]) -> Placement:
        """Place the call, then remember its context."""
        placement = self.place(prompt_ids)
        self.contexts.append([*prompt_ids, *output_ids])
        self.outputs.append(list(output_ids))
        return placement
