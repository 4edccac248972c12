"""Longest-prefix matching of a full token input against the nodes of one execution.

An engine call that sends its whole input (not a delta) is placed below the deepest chain of
existing whole nodes that prefixes it. Apply (against the store) and the recorder's execution
writer (in memory) both ask this; they differ only in how children are listed and compared, so
they pass those in and share the rule.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

Children = Callable[[str | None], Iterable[tuple[str, int]]]
"""``children(parent)`` → ``(node id, length)`` of ``parent``'s children, most recent first
(``None``: the context roots: segment 0's prompts and each compaction's new root)."""

Matches = Callable[[str, int, int], bool]
"""``matches(node_id, offset, length)``: whether the node's tokens equal ``tokens[offset:offset+length]``."""


def match_prefix(children: Children, matches: Matches, n_tokens: int) -> tuple[str | None, int]:
    """Deepest chain of whole nodes prefixing an ``n_tokens``-long input: ``(last node or None, tokens matched)``.

    Every context root is tried (so a full-token call after a compaction lands in the segment the
    recorder's delta would name); the longest match wins, the most recent root on equal lengths.
    Below a root each level takes the most recent child whose tokens come next. Cost: one
    comparison per candidate child on the matched path.
    """
    best: tuple[str | None, int] = (None, 0)
    for root, length in children(None):
        if length <= n_tokens and matches(root, 0, length):
            found = _descend(children, matches, root, length, n_tokens)
            if found[1] > best[1]:
                best = found
    return best


def _descend(children: Children, matches: Matches, node: str, offset: int, n_tokens: int) -> tuple[str, int]:
    while offset < n_tokens:
        for child, length in children(node):
            if offset + length <= n_tokens and matches(child, offset, length):
                node, offset = child, offset + length
                break
        else:
            break
    return node, offset
