"""The storage side of applying a batch: a dialect's reads for the planner, its span sink and its write step.

:func:`sapwood.platform.apply.apply_events` asks :func:`~sapwood.platform.storage.backends.event_applier`
for the connection's :class:`EventApplier` (:mod:`.sqlite.applier`, :mod:`.postgres.applier`), runs the
dialect-free planner (:func:`sapwood.platform.planner.run.apply_batch`) over its
:class:`~sapwood.platform.planner.ports.StoredState` and span sink, and hands the plan to its
:meth:`~EventApplier.write`. Storage implements the planner's ports; it never calls the planner.
"""

from __future__ import annotations

from typing import Protocol

from sqlalchemy.engine import Connection

from sapwood.platform.phase_timer import PhaseTimer
from sapwood.platform.planner.ports import PlannedWrites, SpanSink, StoredState


class EventApplier(Protocol):
    """One connection's reads, span sink and writes for the batches applied in its transaction."""

    conn: Connection

    def stored_state(self) -> StoredState:
        """The planner's reads of the store for one batch, on the applier's connection."""
        ...

    def open_sink(self) -> SpanSink | None:
        """Where the batch's new spans stream while it is planned; None: they are written with the rest."""
        ...

    def write(self, writes: PlannedWrites, timer: PhaseTimer) -> None:
        """Store ``writes`` in the transaction, crediting ``spans``, ``payloads`` and ``store`` to ``timer``."""
        ...


__all__ = ["EventApplier"]
