"""Longest-prefix matching of a full token input against the nodes of one execution.

An engine call that sends its whole input (not a delta) is placed below the deepest chain of
existing whole nodes that prefixes it. Apply (against the store) and the recorder's execution
writer (in memory) both ask this; they differ only in how children are listed and compared, so
they pass those in and share the rule.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

Children = Callable[[str | None], Iterable[tuple[str, int]]]
"""``children(parent)`` → ``(node id, length)`` of ``parent``'s children, most recent first
(``None``: the context roots: segment 0's prompts and each compaction's new root)."""

Matches = Callable[[str, int, int], bool]
"""``matches(node_id, offset, length)``: whether the node's tokens equal ``tokens[offset:offset+length]``."""


#: The most whole-node comparisons one match may make (a hostile tree of many identical siblings
#: cannot make one call's placement cost more); past it the longest match found so far is kept.
MAX_COMPARISONS = 100_000


def match_prefix(children: Children, matches: Matches, n_tokens: int) -> tuple[str | None, int]:
    """Deepest chain of whole nodes prefixing an ``n_tokens``-long input: ``(last node or None, tokens matched)``.

    A depth-first search over the whole tree that backtracks: every context root is tried (so a
    full-token call after a compaction lands in the segment the recorder's delta would name), and
    below each node every child whose tokens come next, not only the first one, so siblings that
    share tokens (identical appended tokens, one sibling a prefix of another) cannot capture a call
    meant for another branch. The longest match wins; on equal lengths the most recent node at the
    first level where the chains part (children are listed most recent first). The search stops at
    a match of the whole input, or after :data:`MAX_COMPARISONS` comparisons.
    """
    best: tuple[str | None, int] = (None, 0)
    budget = MAX_COMPARISONS
    stack: list[tuple[int, Iterator[tuple[str, int]]]] = [(0, iter(children(None)))]
    while stack and budget > 0:
        offset, pending = stack[-1]
        for child, length in pending:
            if offset + length > n_tokens:
                continue
            budget -= 1
            if matches(child, offset, length):
                end = offset + length
                if end > best[1]:
                    best = (child, end)
                    if end == n_tokens:
                        return best
                stack.append((end, iter(children(child))))
                break
            if budget <= 0:
                break
        else:
            stack.pop()
    return best
