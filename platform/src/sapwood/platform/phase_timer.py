"""Phase timing: where a batch's apply time goes, in seconds per named phase.

Apply's phases run back to back, but some work overlaps them (spans streamed to PostgreSQL while
events are planned, COPY payloads built while the server stores the previous one). A
:class:`PhaseTimer` measures *laps* — the time since the previous lap, less what the caller says
was spent on another phase meanwhile — and lets the caller credit that overlapping work to its own
phase with :meth:`PhaseTimer.add`. The phases of one batch then sum to its wall time.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class PhaseTimer:
    """Seconds per phase of the current batch (:attr:`batch`) and summed over every batch (:attr:`totals`).

    One timer may be passed to many :func:`~sapwood.platform.apply.apply_events` calls; each call's
    ``ApplyResult.timings`` is that call's :attr:`batch` dict.
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._mark = clock()
        #: Seconds per phase of the batch begun by the last :meth:`start`.
        self.batch: dict[str, float] = {}
        #: Seconds per phase over every batch this timer measured.
        self.totals: dict[str, float] = {}

    def start(self) -> dict[str, float]:
        """Begin a batch: a fresh :attr:`batch` dict (returned), and the first lap starts now."""
        self.batch = {}
        self._mark = self._clock()
        return self.batch

    def lap(self, phase: str, *, exclude: float = 0.0) -> float:
        """Credit the seconds since the previous lap (or :meth:`start`) to ``phase``, less ``exclude``
        seconds of other phases' work done meanwhile (credited with :meth:`add`); returns them."""
        now = self._clock()
        seconds = now - self._mark - exclude
        self._mark = now
        self.add(phase, seconds)
        return seconds

    def add(self, phase: str, seconds: float) -> None:
        """Credit ``seconds`` measured elsewhere (overlapping work) to ``phase``."""
        self.batch[phase] = self.batch.get(phase, 0.0) + seconds
        self.totals[phase] = self.totals.get(phase, 0.0) + seconds


__all__ = ["PhaseTimer"]
