"""The scheduler's Ray actuator: the live loop's moves carried out by the switch protocol.

``sapwood scheduler run --actuator ray --ray-address ADDR`` joins the Ray cluster where an elastic
runtime was started with ``actor_prefix`` (named, detached actors ``<prefix>-router`` and
``<prefix>-cell-<id>``) and moves those cells as the policy decides. On connect it first rolls back a
half-done switch a killed predecessor left (:meth:`SwitchCoordinator.repair`). The loop records the
``role_assigned`` event and the ``switch_phase`` events from the phases :meth:`RayActuator.move`
returns, so the coordinator here has no recorder.
"""

from __future__ import annotations

from typing import Any

import ray

from sapwood.platform.events import CellRole
from sapwood.scheduler.runtime.switch import PolicySource, SwitchCoordinator, SwitchReport

__all__ = ["RayActuator"]


class RayActuator:
    """Implements the live loop's ``Actuator``: ``move(cell, from, to, reason)`` → ``[(phase, seconds)]``."""

    def __init__(self, coordinator: SwitchCoordinator) -> None:
        self.coordinator = coordinator
        self.repaired: list[SwitchReport] = []
        """Half-done switches :meth:`connect` rolled back (:meth:`SwitchCoordinator.repair`)."""

    @classmethod
    def connect(cls, prefix: str = "sapwood", *, address: str | None = None,
                policy_source: PolicySource | None = None, grace_s: float = 0.5) -> RayActuator:
        """Find the runtime's named actors (joining ``address`` first when Ray is not started here)."""
        from sapwood.scheduler.runtime.cluster import init_ray

        init_ray(address)
        try:
            router = ray.get_actor(f"{prefix}-router")
        except ValueError:
            raise ValueError(f"no elastic runtime with actor prefix {prefix!r} on this Ray cluster "
                             f"(expected a named actor {prefix}-router)") from None
        stats: Any = ray.get(router.stats.remote())
        roles: dict[str, CellRole] = dict(stats["roles"])
        cells: dict[str, Any] = {cid: ray.get_actor(f"{prefix}-cell-{cid}") for cid in roles}
        tiers = {cid: str(st["tier"]) for cid, st in zip(cells, ray.get([c.status.remote() for c in cells.values()]),
                                                         strict=True)}
        coord = SwitchCoordinator(cells, roles, router, None, policy_source=policy_source, tiers=tiers,
                                  grace_s=grace_s)
        actuator = cls(coord)
        actuator.repaired = coord.repair()  # a dead driver's half-done switch, rolled back before any decision
        return actuator

    def queue(self) -> dict[str, Any]:
        """The router's queue lag (``Router.queue``), for the live signals' rollout demand."""
        return dict(ray.get(self.coordinator.router.queue.remote()))

    def move(self, cell_id: str, from_role: CellRole, to_role: CellRole, reason: str) -> list[tuple[str, float]]:
        known = self.coordinator.roles.get(cell_id)
        if known is None:
            raise KeyError(f"cell {cell_id!r} is not a cell of this runtime; known: {sorted(self.coordinator.roles)}")
        report = self.coordinator.switch(cell_id, to_role)
        return [(phase, float(seconds)) for phase, seconds in report.phases.items()]
