"""A restarted gateway continues the sessions it had open: their executions, trees and chains, from its journal.

:func:`resume_sessions` reads the :class:`~sapwood.gateway.journal.SessionJournal`, rebuilds each open
session (its execution's writer through :meth:`~sapwood.rollout.recorder.Recorder.resume`, its tree of
contexts and the output node of each call), sends every journaled event again (ingest keeps an event id
once) and, once the transport delivered them, rewrites the journal with the open sessions' events only
(if they are not delivered within the drain timeout, the journal is kept whole).
"""

from __future__ import annotations

import time
from typing import Any, Protocol

import numpy as np

from sapwood.gateway.journal import SessionJournal, open_executions
from sapwood.gateway.recording import BackgroundRecorder
from sapwood.gateway.sessions import SessionTable
from sapwood.platform.events import ExecutionFinished, ExecutionStarted, ModelCall, PartialScore
from sapwood.rollout.recorder import ExecutionRecorder, Recorder


class Gateway(Protocol):
    """What of :class:`sapwood.gateway.app.Gateway` a restart fills in."""

    config: Any
    journal: SessionJournal | None
    recorder: BackgroundRecorder
    sessions: SessionTable
    executions: dict[str, ExecutionRecorder]

    def recorder_for(self, run_id: str) -> Recorder: ...

#: Execution metadata keys that were session labels (``X-Parent-Session-Id``, ``X-Policy-Version``).
_META_LABELS = ("parent_session", "policy_version")


def resume_sessions(gw: Gateway) -> int:
    """Reopen the journal's open sessions in ``gw`` (before it serves); returns how many."""
    assert gw.journal is not None
    previous = gw.journal.read()
    chains = open_executions(previous)
    now = time.monotonic()
    for session_id, events in chains.items():
        start = events[0]
        assert isinstance(start, ExecutionStarted)
        ex = gw.recorder_for(start.run_id).resume(events)
        labels = {"run": start.run_id, "task": start.task_id, "task_family": start.task_family,
                  **{k: str(start.metadata[k]) for k in _META_LABELS if k in start.metadata}}
        session = gw.sessions.reopen(session_id, labels, now)
        for event in events:
            if isinstance(event, ModelCall):
                prompt = ex.writer.context(event.input_node_id or event.parent or "")
                session.tree.add(prompt.astype(np.int64), event.output_ids.astype(np.int64))
                session.call_nodes.append(event.output_node_id)
        gw.executions[session_id] = ex
    for event in previous:  # whatever the killed process had not delivered (copies are dropped at ingest)
        gw.recorder.send(event)
        if gw.config.ack == "durable" and isinstance(event, ModelCall | ExecutionFinished | PartialScore):
            gw.recorder.take_ack(event.event_id)  # nobody waits for it
    delivered = gw.recorder.wait_until("idle", gw.config.drain_timeout_s)
    gw.journal.rewrite([e for chain in chains.values() for e in chain] if delivered else previous)
    return len(chains)


__all__ = ["resume_sessions"]
