"""A live-loop process that moves one cell of a running elastic runtime (for the ``runtime.mid_switch`` crash
test): joins the Ray cluster at ADDRESS in NAMESPACE, finds the runtime's named actors by PREFIX, waits until CELL has a
call in flight, and ticks a :class:`~sapwood.scheduler.live_loop.SchedulerLoop` once with a policy that moves
CELL to ROLE through the :class:`~sapwood.scheduler.runtime.actuator.RayActuator` (no grace: the calls in
flight are aborted). Prints the phases of the switch as one JSON line.

    python -m tests.support.switch_driver ADDRESS NAMESPACE PREFIX CELL ROLE
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from typing import Any

import ray

from sapwood.scheduler.live_loop import SchedulerLoop
from sapwood.scheduler.policy import Decision
from sapwood.scheduler.runtime.actuator import RayActuator
from sapwood.scheduler.runtime.store_writer import StoreWriterSink
from sapwood.scheduler.signals import CellState, Signals


@dataclass
class MoveOne:
    """Moves ``cell`` to ``role`` and leaves the others where they are."""

    cell: str
    role: Any
    name: str = "move-one"

    def decide(self, signals: Signals, assignment: dict[str, Any]) -> Decision:
        return Decision(target={**assignment, self.cell: self.role}, reasons={self.cell: "test: mid-switch"})


def main(address: str, namespace: str, prefix: str, cell: str, role: str) -> None:
    ray.init(address=address, namespace=namespace, log_to_driver=False)
    actuator = RayActuator.connect(prefix, grace_s=0.0)
    roles = dict(actuator.coordinator.roles)
    handle = actuator.coordinator.cells[cell]
    deadline = time.monotonic() + 300.0
    while int(ray.get(handle.status.remote())["in_flight"]) == 0:  # the switch must catch a call in flight
        if time.monotonic() > deadline:
            raise SystemExit(f"no call in flight on {cell} within 300 s")
        time.sleep(0.01)
    cells = tuple(CellState(cell_id=c, role=r, capacity=2) for c, r in roles.items())
    writer = ray.get_actor(f"{prefix}-store-writer")
    loop = SchedulerLoop(lambda: Signals(at_s=time.time(), cells=cells, batch_size=4), MoveOne(cell, role),
                         StoreWriterSink(writer), actuator)
    result = loop.tick()
    report = actuator.coordinator.reports[-1]
    print(json.dumps({"moves": {c: list(m) for c, m in result.moves.items()}, "aborted_calls": report.aborted_calls,
                      "phases": sorted(report.phases)}))


if __name__ == "__main__":
    main(*sys.argv[1:6])
