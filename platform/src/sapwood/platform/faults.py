"""Deterministic fault points: ``SAPWOOD_FAULT=<point>`` kills the process with SIGKILL at that point.

A crash test sets ``SAPWOOD_FAULT`` in a subprocess's environment and checks what the restart
recovers. ``<point>@<n>`` fires on the n-th time the point is reached (1-based; default 1), so a
process can crash after some progress. The process dies as a ``kill -9`` would leave it: no
``finally`` blocks, no ``atexit`` handlers, open transactions rolled back by the server.

Points (:data:`FAULT_POINTS`):

* ``learner.after_step`` — a trained step, before its checkpoint is written;
* ``learner.after_checkpoint`` — the checkpoint renamed into place, before the commit transaction;
* ``learner.in_commit`` — inside the commit transaction, after the claims went ``done``, before it
  commits;
* ``rollout.after_claim`` — a prompt sample claimed (committed), before its execution starts;
* ``rollout.mid_recording`` — after each model call a worker records (``@n``: the n-th call);
* ``ingest.after_apply`` — a batch applied to the store, before its Kafka offsets are committed;
* ``runtime.mid_switch`` — in the process driving an elastic-runtime switch, the leaving cell's calls
  aborted (each holding its partial output), before they are rerouted.
"""

from __future__ import annotations

import os
import signal

__all__ = ["ENV", "FAULT_POINTS", "armed_point", "fault_point"]

ENV = "SAPWOOD_FAULT"
FAULT_POINTS = frozenset({
    "learner.after_step",
    "learner.after_checkpoint",
    "learner.in_commit",
    "ingest.after_apply",
    "rollout.after_claim",
    "rollout.mid_recording",
    "runtime.mid_switch",
})

_hits: dict[str, int] = {}


def armed_point() -> tuple[str, int] | None:
    """``(point, n)`` parsed from ``SAPWOOD_FAULT``, None when unset; ``ValueError`` on a bad value."""
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return None
    name, _, count = raw.partition("@")
    if name not in FAULT_POINTS:
        raise ValueError(f"{ENV}={raw!r}: unknown fault point {name!r}; expected one of "
                         f"{', '.join(sorted(FAULT_POINTS))} (optionally followed by @N, the hit that fires)")
    if not count:
        return name, 1
    if not count.isdigit() or int(count) < 1:
        raise ValueError(f"{ENV}={raw!r}: the hit count after @ must be an integer ≥ 1, got {count!r}")
    return name, int(count)


def fault_point(name: str) -> None:
    """Mark reaching ``name``; SIGKILL this process if ``SAPWOOD_FAULT`` arms it for this hit."""
    if name not in FAULT_POINTS:
        raise ValueError(f"unknown fault point {name!r}; expected one of {', '.join(sorted(FAULT_POINTS))}")
    armed = armed_point()
    if armed is None or armed[0] != name:
        return
    _hits[name] = _hits.get(name, 0) + 1
    if _hits[name] == armed[1]:
        os.kill(os.getpid(), signal.SIGKILL)
