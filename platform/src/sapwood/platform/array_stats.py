"""Per-array figures of a whole batch, computed in a few vectorized passes.

Apply needs, for every token array of a batch, its largest id (the vocabulary check) and the
bitwise OR of its ids (the storage encoding), for every log-prob array whether it holds finite
values ≤ 0, and for every array its content digest. One numpy call per array costs microseconds
of overhead each, thousands of times per batch; here each figure is one ``reduceat`` over the
batch's arrays laid end to end.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sapwood.platform.tokens import LOGPROB_DTYPE, MAX_LOGPROB, TOKEN_DTYPE, digest_bytes


@dataclass
class ArrayStats:
    """Figures of the non-empty canonical arrays given to :func:`batch_stats`, keyed by ``id(array)``.

    Entries keep their array so an id reused by another object is never mistaken for it.
    """

    #: id → (array, largest id read as uint32 — a negative id reads ≥ 2**31, bitwise OR of its ids).
    tokens: dict[int, tuple[np.ndarray, int, int]] = field(default_factory=dict)
    #: id → (array, whether every log-prob is finite and ≤ :data:`MAX_LOGPROB`).
    logprobs: dict[int, tuple[np.ndarray, bool]] = field(default_factory=dict)
    #: id → (array, BLAKE2b-128 digest of its canonical bytes); filled when digests were asked for.
    digests: dict[int, tuple[np.ndarray, bytes]] = field(default_factory=dict)

    def token_top(self, arr: np.ndarray) -> int | None:
        """Largest id of ``arr`` as uint32, or None when ``arr`` was not in the batch."""
        return _known(self.tokens, arr, 1)

    def token_bits(self, arr: np.ndarray) -> int | None:
        """Bitwise OR of ``arr``'s ids (its bit length is the largest id's), or None when unknown."""
        return _known(self.tokens, arr, 2)

    def logprobs_ok(self, arr: np.ndarray) -> bool | None:
        """Whether ``arr`` holds finite log-probs ≤ :data:`MAX_LOGPROB`; None when unknown."""
        return _known(self.logprobs, arr, 1)

    def digest(self, arr: np.ndarray) -> bytes | None:
        """Content digest of ``arr``, or None when unknown."""
        return _known(self.digests, arr, 1)


def _known(table: dict[int, tuple[Any, ...]], arr: np.ndarray, index: int) -> Any:
    """Item ``index`` of ``arr``'s entry in ``table`` (keyed by ``id(array)``, the array first), or None
    when ``table`` has no entry for this very object."""
    entry = table.get(id(arr))
    return entry[index] if entry is not None and entry[0] is arr else None


def batch_stats(arrays: Iterable[np.ndarray], *, digests: bool = False) -> ArrayStats:
    """Figures of every non-empty int32 token array [n] and float32 log-prob array [n] in ``arrays``;
    with ``digests``, their content digests too."""
    stats = ArrayStats()
    toks: list[np.ndarray] = []
    lps: list[np.ndarray] = []
    seen: set[int] = set()
    for arr in arrays:
        if arr.size == 0 or id(arr) in seen:
            continue
        seen.add(id(arr))
        if arr.dtype == TOKEN_DTYPE:
            toks.append(arr)
        elif arr.dtype == LOGPROB_DTYPE:
            lps.append(arr)
    if toks:
        ids = np.concatenate(toks)  # [total] int32
        starts = _starts(toks)
        tops = np.maximum.reduceat(ids.view(np.uint32), starts).tolist()
        bits = np.bitwise_or.reduceat(ids, starts).tolist()
        for arr, top, b in zip(toks, tops, bits, strict=True):
            stats.tokens[id(arr)] = (arr, top, b)
    if lps:
        values = np.concatenate(lps)  # [total] float32
        starts = _starts(lps)
        # NaN propagates through both reductions and fails both comparisons.
        highest = np.maximum.reduceat(values, starts)
        lowest = np.minimum.reduceat(values, starts)
        ok = ((highest <= MAX_LOGPROB) & (lowest > -np.inf)).tolist()
        for arr, good in zip(lps, ok, strict=True):
            stats.logprobs[id(arr)] = (arr, good)
    if digests:
        for arr in (*toks, *lps):
            stats.digests[id(arr)] = (arr, digest_bytes(np.ascontiguousarray(arr).data))
    return stats


def _starts(arrays: list[np.ndarray]) -> np.ndarray:
    """Offsets [k] of each array's first element once ``arrays`` are laid end to end."""
    sizes = np.fromiter((a.size for a in arrays), dtype=np.int64, count=len(arrays))
    starts = np.zeros(len(arrays), dtype=np.int64)
    np.cumsum(sizes[:-1], out=starts[1:])
    return starts


__all__ = ["ArrayStats", "batch_stats"]
