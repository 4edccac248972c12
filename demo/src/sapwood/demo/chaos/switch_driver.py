"""A live-loop process that moves one cell of a running elastic runtime (for the ``runtime.mid_switch``
crash rounds, :mod:`sapwood.demo.chaos.mid_switch`): joins the Ray cluster at ADDRESS in NAMESPACE, finds the
runtime's named actors by PREFIX, waits until CELL has a call in flight, and ticks a
:class:`~sapwood.scheduler.live_loop.SchedulerLoop` once with a policy that moves CELL to ROLE through the
:class:`~sapwood.scheduler.runtime.actuator.RayActuator` (no grace: the calls in flight are aborted; it waits
for a call in flight on CELL only when ``SAPWOOD_FAULT`` is set). Connecting rolls back a half-done switch
first. Prints the move's and the repair's phases as one JSON line.

    python -m sapwood.demo.chaos.switch_driver ADDRESS NAMESPACE PREFIX CELL ROLE
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import ray

from sapwood.platform.events.cells import CellRole
from sapwood.scheduler.live_loop import SchedulerLoop
from sapwood.scheduler.policy import Assignment, Decision
from sapwood.scheduler.runtime.actuator import RayActuator
from sapwood.scheduler.runtime.store_writer import StoreWriterSink
from sapwood.scheduler.signals import CellState, Signals


@dataclass
class MoveOne:
    """Moves ``cell`` to ``role`` and leaves the others where they are."""

    cell: str
    role: CellRole
    name: str = "move-one"

    def initial_assignment(self, cell_ids: Sequence[str]) -> dict[str, CellRole]:
        """Every cell in rollout (the loop asks only before its first signal; the driver ticks a running one)."""
        return dict.fromkeys(cell_ids, "rollout")

    def decide(self, signals: Signals, assignment: Assignment) -> Decision:
        return Decision(target={**assignment, self.cell: self.role}, reasons={self.cell: "chaos: mid-switch"})


def main(address: str, namespace: str, prefix: str, cell: str, role: CellRole) -> None:
    ray.init(address=address, namespace=namespace, log_to_driver=False)
    actuator = RayActuator.connect(prefix, grace_s=0.0)  # rolls back a half-done switch first
    print(f"connected; repaired {[r.cell_id for r in actuator.repaired]}", file=sys.stderr, flush=True)
    roles = dict(actuator.coordinator.roles)
    handle = actuator.coordinator.cells[cell]
    deadline = time.monotonic() + 900.0
    while os.environ.get("SAPWOOD_FAULT") and int(ray.get(handle.status.remote())["in_flight"]) == 0:
        # the armed run's switch must catch a call in flight
        if time.monotonic() > deadline:
            raise SystemExit(f"no call in flight on {cell} within 900 s")
        time.sleep(0.01)
    cells = tuple(CellState(cell_id=c, role=r, capacity=2) for c, r in roles.items())
    writer = ray.get_actor(f"{prefix}-store-writer")
    loop = SchedulerLoop(lambda: Signals(at_s=time.time(), cells=cells, batch_size=4), MoveOne(cell, role),
                         StoreWriterSink(writer), actuator)
    result = loop.tick()
    moved = [r for r in actuator.coordinator.reports if r not in actuator.repaired]
    print(json.dumps({"moves": {c: list(m) for c, m in result.moves.items()},
                      "aborted_calls": sum(r.aborted_calls for r in moved),
                      "phases": sorted({p for r in moved for p in r.phases}),
                      "repaired": [{"cell": r.cell_id, "to_role": r.to_role, "aborted_calls": r.aborted_calls,
                                    "phases": sorted(r.phases)} for r in actuator.repaired]}))


if __name__ == "__main__":
    if len(sys.argv) != 6 or sys.argv[5] not in ("rollout", "train", "idle"):
        raise SystemExit(__doc__)
    address, namespace, prefix, cell, role = sys.argv[1:]
    main(address, namespace, prefix, cell, cast(CellRole, role))
