"""The router: sends each engine call to a rollout cell and re-issues it when that attempt is lost.

An attempt is lost when its cell aborts it (a switch's grace period ran out) or dies (``ray.kill``,
a crash: :class:`ray.exceptions.RayActorError`). The router then sends the *same* input ids to
another rollout cell (the switch's KV-handoff target when one was named) and keeps going until an
attempt completes; only that one is returned, so the execution records exactly one TITO call per
logical call — none lost, none duplicated — and an aborted attempt's partial tokens never leave
the cell.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from typing import Any

from ray.exceptions import RayActorError

__all__ = ["Router"]


class Router:
    """Routes calls over cells (an async Ray actor, made one in :mod:`.cluster`); ``add_cell`` registers each
    cell's actor handle, capacity and role."""

    def __init__(self, *, no_cell_timeout_s: float = 120.0) -> None:
        self.cells: dict[str, Any] = {}
        self.capacity: dict[str, int] = {}
        self.roles: dict[str, str] = {}
        self.load: dict[str, int] = {}
        self.draining: set[str] = set()
        self.lost: dict[str, str] = {}
        self.hints: dict[str, str] = {}
        self.rerouted_keys: dict[str, str] = {}
        self.pending_reroute: set[str] = set()
        self.no_cell_timeout_s = no_cell_timeout_s
        self.counts = {"calls": 0, "attempts": 0, "rerouted": 0, "aborted": 0, "cell_lost": 0, "refused": 0,
                       "discarded_tokens": 0}
        self._changed = asyncio.Event()

    # -- membership ---------------------------------------------------------------------------------
    def add_cell(self, cell_id: str, handle: Any, capacity: int, role: str) -> None:
        self.cells[cell_id], self.capacity[cell_id], self.roles[cell_id] = handle, capacity, role
        self.load.setdefault(cell_id, 0)
        self._changed.set()

    def set_role(self, cell_id: str, role: str) -> None:
        self.roles[cell_id] = role
        self.draining.discard(cell_id)
        self._changed.set()

    def drain(self, cell_id: str) -> None:
        """Route no new call to ``cell_id``."""
        self.draining.add(cell_id)

    def plan_reroute(self, call_keys: list[str], source: str) -> dict[str, str | None]:
        """Pick a target cell for each aborted call (least loaded rollout cell other than ``source``) and
        remember it as a hint; the calls count as pending until re-admitted (:meth:`wait_rerouted`)."""
        out: dict[str, str | None] = {}
        extra: dict[str, int] = {}
        for key in call_keys:
            free = [c for c in self._eligible() if c != source]
            free.sort(key=lambda c: (self.load[c] + extra.get(c, 0)) / self.capacity[c])
            target = free[0] if free else None
            out[key] = target
            if target is not None:
                self.hints[key] = target
                extra[target] = extra.get(target, 0) + 1
            self.pending_reroute.add(key)
        return out

    async def wait_rerouted(self, call_keys: list[str], timeout_s: float) -> bool:
        """Wait until every one of ``call_keys`` was re-admitted on another cell (or finished)."""
        deadline = time.monotonic() + timeout_s
        while any(k in self.pending_reroute for k in call_keys):
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.002)
        return True

    def _eligible(self) -> list[str]:
        return [c for c, r in self.roles.items() if r == "rollout" and c not in self.draining and c not in self.lost]

    async def _pick(self, key: str) -> str | None:
        deadline = time.monotonic() + self.no_cell_timeout_s
        while True:
            hint = self.hints.pop(key, None)
            free = [c for c in self._eligible() if self.load[c] < self.capacity[c]]
            if hint in free:
                return hint
            if free:
                return min(free, key=lambda c: self.load[c] / self.capacity[c])
            if time.monotonic() > deadline:
                return None
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout=0.01)

    # -- calls --------------------------------------------------------------------------------------
    async def generate(self, input_ids: list[int], params: dict[str, Any]) -> dict[str, Any]:
        """Serve one logical call; the answer carries ``attempts`` (each lost attempt's cell and why)."""
        key = str(uuid.uuid4())
        self.counts["calls"] += 1
        attempts: list[dict[str, Any]] = []
        try:
            while True:
                cid = await self._pick(key)
                if cid is None:
                    return {"status": "error", "reason": f"no rollout cell had a free slot for "
                            f"{self.no_cell_timeout_s:.0f} s", "attempts": attempts}
                self.load[cid] += 1
                self.pending_reroute.discard(key)
                self.counts["attempts"] += 1
                try:
                    res: dict[str, Any] = await self.cells[cid].generate.remote(key, input_ids, params)
                except RayActorError as exc:
                    self.lost.setdefault(cid, f"{type(exc).__name__}: {str(exc)[:300]}")
                    self.counts["cell_lost"] += 1
                    res = {"status": "lost", "reason": f"cell {cid} died mid-call"}
                finally:
                    self.load[cid] -= 1
                    self._changed.set()
                status = res.get("status")
                if status == "ok":
                    res["attempts"] = attempts
                    if attempts:
                        self.counts["rerouted"] += 1
                    return res
                if status == "refused":
                    self.counts["refused"] += 1
                    await asyncio.sleep(0.002)
                    continue
                if status == "aborted":
                    self.counts["aborted"] += 1
                    self.counts["discarded_tokens"] += int(res.get("discarded_tokens", 0))
                attempts.append({"cell_id": cid, "status": status, "reason": res.get("reason", "")})
        finally:
            self.pending_reroute.discard(key)
            self.hints.pop(key, None)

    def stats(self) -> dict[str, Any]:
        return {**self.counts, "lost_cells": dict(self.lost), "load": dict(self.load), "roles": dict(self.roles),
                "draining": sorted(self.draining)}
