"""Starting the elastic runtime: the store writer, the router, the cells and the switch coordinator."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any

import ray

from sapwood.platform.events import CellHeartbeat, CellRegistered, RoleAssigned
from sapwood.scheduler.runtime.cell import Cell
from sapwood.scheduler.runtime.router import Router
from sapwood.scheduler.runtime.store_writer import StoreWriter
from sapwood.scheduler.runtime.switch import PolicySource, SwitchCoordinator

__all__ = ["CellSpec", "ElasticRuntime", "init_ray"]


def init_ray(address: str | None = None, *, num_cpus: int = 2) -> None:
    """Join the cluster at ``address`` or start a local Ray (no dashboard); no-op when already started."""
    if ray.is_initialized():
        return
    if address:
        ray.init(address=address, log_to_driver=False)
    else:
        ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)


@dataclass(frozen=True)
class CellSpec:
    """A cell to start: its id, capacity (concurrent calls in rollout), tier and first role."""

    cell_id: str
    capacity: int = 2
    role: str = "rollout"
    tier: str = "core"


class ElasticRuntime:
    """Actors of one elastic run; ``model_config``/``state``/``version`` are the weights cells start with."""

    def __init__(self, database_url: str, specs: list[CellSpec], model_config: Any, state: dict[str, Any], *,
                 version: int = 0, seed: int = 0, decode_delay_s: float = 0.0, grace_s: float = 0.5,
                 policy_source: PolicySource | None = None, policy_name: str = "manual",
                 actor_prefix: str | None = None) -> None:
        if len({s.cell_id for s in specs}) != len(specs):
            raise ValueError(f"cell ids must be unique, got {[s.cell_id for s in specs]}")
        named = (lambda what: {"name": f"{actor_prefix}-{what}", "lifetime": "detached"}) if actor_prefix else (
            lambda what: {})
        self.writer = StoreWriter.options(**named("store-writer")).remote(database_url)  # type: ignore[attr-defined]
        self.router = Router.options(**named("router")).remote()  # type: ignore[attr-defined]
        self.specs = {s.cell_id: s for s in specs}
        self.cells: dict[str, Any] = {}
        self.roles: dict[str, str] = {}
        self.policy_name = policy_name
        self.actor_prefix = actor_prefix
        events: list[Any] = []
        for i, s in enumerate(specs):
            actor = Cell.options(max_concurrency=s.capacity + 8, **named(f"cell-{s.cell_id}"))  # type: ignore[attr-defined]
            self.cells[s.cell_id] = actor.remote(s.cell_id, model_config, state, version=version, capacity=s.capacity,
                                                 tier=s.tier, role=s.role, seed=seed * 101 + i,
                                                 decode_delay_s=decode_delay_s)
            self.roles[s.cell_id] = s.role
            events.append(CellRegistered(cell_id=s.cell_id, tier=s.tier, capacity=s.capacity,
                                         metadata={"engine": "local-torch", "runtime": "ray"}))
            events.append(RoleAssigned(cell_id=s.cell_id, role=s.role, previous_role="idle", reason="initial",
                                       policy=policy_name))
        ray.get([c.status.remote() for c in self.cells.values()])  # wait until every cell is up
        ray.get([self.router.add_cell.remote(s.cell_id, self.cells[s.cell_id], s.capacity, s.role) for s in specs])
        ray.get(self.writer.apply.remote(events))
        self.coordinator = SwitchCoordinator(self.cells, self.roles, self.router, self.writer,
                                             policy_source=policy_source, grace_s=grace_s,
                                             tiers={s.cell_id: s.tier for s in specs})

    def assign(self, cell_id: str, role: str, *, reason: str = "", signals: dict[str, Any] | None = None) -> Any:
        """Record ``role_assigned`` and run the switch; returns the :class:`SwitchReport`."""
        previous = self.roles[cell_id]
        ray.get(self.writer.apply.remote([RoleAssigned(cell_id=cell_id, role=role, previous_role=previous,
                                                       reason=reason, policy=self.policy_name,
                                                       signals=signals or {})]))
        return self.coordinator.switch(cell_id, role)

    def heartbeat(self) -> list[dict[str, Any]]:
        """Ask every live cell for its status and record a ``cell_heartbeat`` for each that answers."""
        out, events = [], []
        for cid, cell in self.cells.items():
            try:
                st = ray.get(cell.status.remote(), timeout=5)
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                continue
            out.append(st)
            figures = {k: st[k] for k in ("in_flight", "served", "aborted", "policy_version")}
            events.append(CellHeartbeat(cell_id=cid, created_at=time.time(), status=figures))
        if events:
            ray.get(self.writer.apply.remote(events))
        return out

    def query(self, sql: str, params: dict[str, Any] | None = None) -> list[tuple[Any, ...]]:
        return list(ray.get(self.writer.query.remote(sql, params)))

    def shutdown(self) -> None:
        with contextlib.suppress(ray.exceptions.RayActorError):
            ray.get(self.writer.close.remote())
        for actor in [self.router, self.writer, *self.cells.values()]:
            ray.kill(actor)
