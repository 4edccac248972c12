"""One batch through apply: drop duplicates, plan every event, let the applier write the plan, time each phase.

Dialect-free: :func:`sapwood.platform.apply.apply_events` passes a storage applier's
:class:`~sapwood.platform.planner.ports.StoredState`, a way to open its span sink (if it streams
spans while the batch is planned) and its write step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sapwood.platform.errors import ConflictError, ValidationError
from sapwood.platform.events import Event
from sapwood.platform.phase_timer import PhaseTimer
from sapwood.platform.planner.batch import BatchPlanner
from sapwood.platform.planner.ports import PlannedWrites, SpanSink, StoredState
from sapwood.platform.planner.results import ApplyResult, ContextCache, Rejected
from sapwood.platform.replays import matches_stored, replay_conflict, same_batch_conflict

Write = Callable[[PlannedWrites, PhaseTimer], None]
"""An applier's write step: store the planned rows, crediting its phases (``spans``, ``payloads``,
``store``) to the timer."""


def apply_batch(
    events: Sequence[Event],
    *,
    state: StoredState,
    write: Write,
    open_sink: Callable[[], SpanSink | None] | None = None,
    cache: ContextCache | None = None,
    strict: bool = True,
    replay: bool = False,
    timer: PhaseTimer | None = None,
) -> ApplyResult:
    """Validate and apply ``events`` (in order) through an applier's ``state`` and ``write``.

    ``strict``: raise on the first invalid event (nothing written); otherwise collect invalid
    events in ``ApplyResult.rejected`` and apply the others. ``replay``: re-derive projections
    from events already stored (no event/span writes, no duplicate check) — used by rebuilds.
    ``open_sink``: opens where new spans stream while the batch is planned (called only when there
    is something to plan and store; None from it: the applier writes the spans with the rest).
    Phases: ``lookups``, ``digests``, ``plan`` here, the rest in ``write``.
    """
    result = ApplyResult()
    if not events:
        return result
    for ev in events:
        if not isinstance(ev, Event):
            raise ValidationError(f"apply_events expects Event objects, got {type(ev).__name__}")
    timer = timer if timer is not None else PhaseTimer()
    result.timings = timer.start()
    todo = list(events) if replay else _fresh(state, events, result, strict=strict)
    sink = open_sink() if open_sink is not None and not replay and todo else None
    plan = BatchPlanner(state, cache, replay=replay, sink=sink)
    try:
        plan.load(todo)
        timer.lap("lookups")
        plan.prepare_arrays(todo)
        timer.lap("digests")
        for ev in todo:
            try:
                plan.plan(ev)
            except (ValidationError, ConflictError) as exc:
                if strict:
                    raise
                result.rejected.append(Rejected(ev, exc))
                continue
            result.applied.append(ev)
            result.tokens += ev.n_tokens()
        timer.lap("plan", exclude=sink.seconds if sink is not None else 0.0)
        write(plan.writes(), timer)
    except BaseException as exc:
        if sink is not None:
            sink.abort(exc)
        raise
    result.new_states = plan.new_states()
    return result


def _fresh(state: StoredState, events: Sequence[Event], result: ApplyResult, *, strict: bool) -> list[Event]:
    """``events`` less the ones stored already or repeated in the batch (counted in ``result.duplicates``);
    a reused id with other content is a conflict (raised when ``strict``, else rejected)."""
    existing = state.prior_events([e.event_id for e in events])
    seen: dict[str, Event] = {}
    fresh: list[Event] = []
    for ev in events:
        prior = existing.get(ev.event_id)
        first = seen.get(ev.event_id)
        if prior is None and first is None:
            seen[ev.event_id] = ev
            fresh.append(ev)
            continue
        if prior is not None:
            same_keys = (prior[0], prior[1], prior[2]) == (ev.execution_id, ev.seq, ev.kind)
            conflict = not same_keys or (prior[3] is not None and not matches_stored(prior[3], ev))
            err = replay_conflict(state.stored_event, ev, prior) if conflict else None
        else:
            assert first is not None
            err = same_batch_conflict(first, ev)
        if err is not None:
            if strict:
                raise err
            result.rejected.append(Rejected(ev, err))
            continue
        result.duplicates += 1
    return fresh


__all__ = ["Write", "apply_batch"]
