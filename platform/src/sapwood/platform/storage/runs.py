"""The run queue: which executions a training run consumes, claimed exactly once by its learners.

A run is a row of ``runs`` (a filter over executions, a kind, a seed) plus its items in ``run_items``,
one per queued execution: ``pending`` → ``claimed`` (by one learner, until ``lease_until``, unix
seconds) → ``done``. The protocol below is everything that touches those two tables; callers own the
transaction (every method takes the open :class:`~sqlalchemy.engine.Connection`).

Semantics every implementation keeps (``tests/platform/storage/test_run_queue_contract.py``):

* **claim** takes up to ``limit`` items in run order that are pending or whose lease ended strictly
  before ``now`` (at ``now == lease_until`` the lease still holds); two claimers never get the same item;
* **renew** extends the lease of the items this learner still holds (whether or not it expired) and
  returns how many it renewed;
* **complete** marks done the items this learner still holds and returns those it no longer held;
* **release** gives back this learner's claimed items; ids it does not hold are left as they are;
* **snapshot** queues the finished executions matching the run's filter that are not queued yet: in the
  seed's order for a replay run, in finish order for a live run.

:func:`run_queue` picks the implementation for a dialect: :mod:`.sqlite.runs` (no row locks: a
conditional update decides each claim) or :mod:`.postgres.runs` (``FOR UPDATE SKIP LOCKED``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, Protocol

from sqlalchemy.engine import Connection

if TYPE_CHECKING:
    from sapwood.platform.execution_filter import ExecutionFilter

RunKind = Literal["live", "replay"]


class RunQueue(Protocol):
    """Runs and their items on one backend; see the module docstring for the contract."""

    def create(self, conn: Connection, run_id: str, *, kind: RunKind, filter_json: dict[str, Any], seed: int,
               config: dict[str, Any], description: str, created_at: float) -> None:
        """Insert the run (no items yet); :class:`~sapwood.platform.errors.ConflictError` if it exists."""
        ...

    def get(self, conn: Connection, run_id: str) -> dict[str, Any] | None:
        """The run's row (``run_id kind filter seed config description created_at``), None if there is none."""
        ...

    def snapshot(self, conn: Connection, run_id: str, flt: ExecutionFilter, *, kind: RunKind, seed: int,
                 now: float | None = None) -> int:
        """Queue the finished executions matching ``flt`` not queued yet; return how many were queued."""
        ...

    def claim(self, conn: Connection, run_id: str, learner_id: str, limit: int, *, lease_s: float,
              now: float | None = None) -> list[str]:
        """Claim up to ``limit`` available items until ``now + lease_s``; their execution ids in run order."""
        ...

    def renew(self, conn: Connection, run_id: str, learner_id: str, execution_ids: list[str], *, lease_s: float,
              now: float | None = None) -> int:
        """Extend to ``now + lease_s`` the leases ``learner_id`` still holds among ``execution_ids``; how many."""
        ...

    def complete(self, conn: Connection, run_id: str, learner_id: str, execution_ids: list[str], *,
                 now: float | None = None) -> list[str]:
        """Mark done the items ``learner_id`` holds; return the ids (in the given order) it no longer held."""
        ...

    def release(self, conn: Connection, run_id: str, learner_id: str, execution_ids: list[str]) -> None:
        """Return ``learner_id``'s claimed items among ``execution_ids`` to pending."""
        ...

    def release_holder(self, conn: Connection, run_id: str, learner_id: str) -> int:
        """Return every item ``learner_id`` still has claimed to pending; how many."""
        ...

    def release_predecessors(self, conn: Connection, run_id: str, identity: str, learner_id: str) -> int:
        """Return to pending the items earlier processes of ``identity`` claimed (``LeaseQueue``); how many."""
        ...

    def progress(self, conn: Connection, run_id: str) -> dict[str, int]:
        """Items per state: ``{"pending": n, "claimed": n, "done": n}``."""
        ...
