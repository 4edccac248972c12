"""Per-execution state of a planned batch: order (``seq``), status and the counters of ``executions``.

Each execution the batch touches is one ``executions`` row (column → value), loaded once and then
updated in memory event by event; the applier inserts the new rows and updates the others.
"""

from __future__ import annotations

from collections.abc import Sequence

from sapwood.platform.errors import ConflictError, SequenceError, UnknownParentError
from sapwood.platform.events import Event, ExecutionStarted, PartialScore
from sapwood.platform.planner.ports import Row, StoredState

#: Counters a new execution starts at 0.
COUNTERS = ("n_nodes", "n_tokens", "n_input_tokens", "n_output_tokens", "n_calls", "n_forks")


class ExecutionLedger:
    """The ``executions`` rows of a batch: stored ones (locked) and those its events start."""

    def __init__(self) -> None:
        self.rows: dict[str, Row] = {}
        self.new: set[str] = set()

    def load(self, state: StoredState, events: Sequence[Event]) -> None:
        """Load (and lock) the stored rows of every execution ``events`` name."""
        ids = sorted({e.execution_id for e in events if e.execution_id})
        if ids:
            self.rows.update(state.executions(ids))

    def start(self, e: ExecutionStarted) -> None:
        """Add the row of the execution ``e`` starts (its checks passed)."""
        assert e.execution_id is not None
        self.rows[e.execution_id] = {
            "execution_id": e.execution_id,
            "run_id": e.run_id,
            "task_id": e.task_id,
            "task_family": e.task_family,
            "engine": e.engine,
            "sampling_params": e.sampling_params,
            "vocab_size": e.vocab_size,
            "metadata": e.metadata,
            "status": "running",
            "reward": None,
            "leaf_rewards": {},
            "message": "",
            "started_at": e.created_at,
            "finished_at": None,
            "last_seq": 0,
            "n_segments": 1,
            "max_policy_version": None,
            "score": None,
            "score_revision": None,
            **dict.fromkeys(COUNTERS, 0),
        }
        self.new.add(e.execution_id)

    def check_seq(self, event: Event) -> Row | None:
        """The row of ``event``'s execution, once its order is checked: seq must be exactly last_seq + 1,
        and only partial scores may follow the end. None for events outside executions and for starts."""
        if not event.execution_scoped:
            return None
        if isinstance(event, ExecutionStarted):
            if event.execution_id in self.rows:
                raise ConflictError(
                    f"execution {event.execution_id} was already started by another event; "
                    f"event {event.event_id} reuses its id"
                )
            return None
        st = self.rows.get(event.execution_id or "")
        if st is None:
            raise UnknownParentError(
                f"{event.kind} for unknown execution {event.execution_id}; expected an execution_started "
                "event (seq 0) first",
                event_id=event.event_id,
            )
        expected = st["last_seq"] + 1
        if event.seq != expected:
            kind = "gap" if (event.seq or 0) > expected else "reuse"
            raise SequenceError(
                f"sequence {kind} in execution {event.execution_id}: got seq {event.seq}, expected {expected}",
                event_id=event.event_id,
            )
        if st["status"] != "running" and not isinstance(event, PartialScore):
            raise SequenceError(
                f"{event.kind} after execution {event.execution_id} finished ({st['status']}); only "
                "partial_score events may follow execution_finished",
                event_id=event.event_id,
            )
        return st

    def new_rows(self) -> list[Row]:
        """Rows of the executions the batch started (to insert), by id."""
        return [self.rows[x] for x in sorted(self.new)]

    def touched_rows(self) -> list[Row]:
        """Rows of the stored executions the batch touched (to update)."""
        return [row for x, row in self.rows.items() if x not in self.new]


def count_node(st: Row, length: int) -> None:
    """Count a new node of ``length`` tokens in execution row ``st``."""
    st["n_nodes"] += 1
    st["n_tokens"] += length


def count_call(st: Row, *, input_len: int, n_output: int, policy_version: int) -> None:
    """Count a model call (its full input, its output tokens and the policy that sampled it) in ``st``."""
    st["n_calls"] += 1
    st["n_input_tokens"] += input_len
    st["n_output_tokens"] += n_output
    mpv = st["max_policy_version"]
    st["max_policy_version"] = policy_version if mpv is None else max(mpv, policy_version)


__all__ = ["COUNTERS", "ExecutionLedger", "count_call", "count_node"]
