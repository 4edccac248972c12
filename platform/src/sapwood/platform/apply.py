"""Apply: the one function that turns TITO events into stored state.

Both the Kafka ingest and the in-process transport call :func:`apply_events` inside a
database transaction. It is idempotent (an event id already stored is skipped), checks the
per-execution order, verifies every model call's input digest against the input
reconstructed from the tree, and writes the events, their spans and every projection in
the caller's transaction — so either the whole batch lands or nothing does.

This module orchestrates; the work is split in two below it. The dialect-free planner
(:mod:`sapwood.platform.planner`) validates each event against the stored state plus the effects of
the batch's earlier events and returns the rows to write; it reads the store only through its own
ports (:mod:`sapwood.platform.planner.ports`). The event applier of the connection's dialect
(:mod:`sapwood.platform.storage.applier` and its SQLite and PostgreSQL implementations) implements
those ports and writes the rows — on PostgreSQL overlapping the two, streaming new spans while later
events are still being planned. Storage never calls the planner (an import contract keeps it so). Phase seconds go to a
:class:`~sapwood.platform.phase_timer.PhaseTimer`.
In ``strict`` mode the first invalid event raises and nothing is written; otherwise invalid
events are returned as :class:`Rejected` (for the dead letters) and the rest are applied.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy.engine import Connection

from sapwood.platform.events import Event
from sapwood.platform.phase_timer import PhaseTimer
from sapwood.platform.planner.results import ApplyResult, ContextCache, Rejected
from sapwood.platform.planner.run import apply_batch
from sapwood.platform.storage.backends import event_applier


def apply_events(conn: Connection, events: Sequence[Event], *, cache: ContextCache | None = None,
                 strict: bool = True, replay: bool = False, timer: PhaseTimer | None = None) -> ApplyResult:
    """Validate and apply ``events`` (in order) inside the caller's transaction on ``conn``.

    ``strict``: raise on the first invalid event (nothing written); otherwise collect invalid
    events in ``ApplyResult.rejected`` and apply the others. ``replay``: re-derive projections
    from events already stored (no event/span writes, no duplicate check) — used by rebuilds.
    ``timer``: receives the batch's phase seconds (``ApplyResult.timings`` holds this batch's).
    The caller merges ``result.new_states`` into ``cache`` after its transaction commits.
    """
    applier = event_applier(conn)
    return apply_batch(events, state=applier.stored_state(), write=applier.write, open_sink=applier.open_sink,
                       cache=cache, strict=strict, replay=replay, timer=timer)


__all__ = ["ApplyResult", "ContextCache", "PhaseTimer", "Rejected", "apply_events"]
