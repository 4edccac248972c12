"""The spans of a planned batch: content addresses, batch-wide array figures, and which are new.

Refs: every handler notes each array of its event as ``[span digest hex or None, length]`` in the
event's ``refs`` (the stored event body's ``arrays``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from sapwood.platform.array_stats import ArrayStats, batch_stats
from sapwood.platform.events import Event
from sapwood.platform.planner.ports import SpanSink, StoredState
from sapwood.platform.tokens import digest_bytes

Refs = dict[str, list[Any]]
"""Array name → [span digest hex or None, element count], as the stored event body keeps them."""


class SpanEffects:
    """Spans the batch references (digest → canonical array) and the new ones streamed to ``sink``."""

    def __init__(self, state: StoredState, sink: SpanSink | None) -> None:
        self._state = state
        #: Where spans not stored yet go as soon as their event is planned; None: the applier writes
        #: :attr:`spans` at the end.
        self.sink = sink
        #: Batch-wide array figures (and digests) from :meth:`prepare` (empty until then).
        self.stats = ArrayStats()
        #: digest → canonical span array (int32 ids [n] or float32 log-probs [n]) the batch references.
        self.spans: dict[bytes, np.ndarray] = {}
        #: digest → whether the store already holds that span (before this batch).
        self._stored: dict[bytes, bool] = {}

    def prepare(self, events: Sequence[Event]) -> None:
        """Check figures of every array of ``events`` in a few vectorized passes; with a sink, also
        digest every array and look up which spans are stored already."""
        arrays = [arr for e in events for arr in e.array_fields().values() if arr.size]
        digests = self.sink is not None
        self.stats = batch_stats(arrays, digests=digests)
        if not digests:
            return
        wanted = {d for _, d in self.stats.digests.values()}
        stored = self._state.stored_spans(wanted)
        self._stored = {d: d in stored for d in wanted}

    def digest_of(self, arr: np.ndarray) -> bytes:
        """Content address of a contiguous canonical array (from :meth:`prepare` when known)."""
        known = self.stats.digest(arr)
        return known if known is not None else digest_bytes(arr.data)

    def add(self, refs: Refs, name: str, arr: np.ndarray) -> bytes | None:
        """Reference ``arr`` (the event's array ``name``) as a span, new to the batch or not; note it in
        ``refs``. Returns its digest (None when empty)."""
        if arr.size == 0:
            refs[name] = [None, 0]
            return None
        arr = np.ascontiguousarray(arr)
        digest = self.digest_of(arr)
        refs[name] = [digest.hex(), int(arr.size)]
        if digest not in self.spans:
            self.spans[digest] = arr
            if self.sink is not None and not self._is_stored(digest):
                self.sink.add(digest, arr, bits=self.stats.token_bits(arr))
        return digest

    def _is_stored(self, digest: bytes) -> bool:
        stored = self._stored.get(digest)
        if stored is None:
            stored = self._stored[digest] = bool(self._state.stored_spans([digest]))
        return stored


__all__ = ["Refs", "SpanEffects"]
