"""The default elastic policy: balance rollout production against learner consumption.

Each tick it sizes the rollout pool to the rollout demand (running + paused + admitted rollouts) and
gives every other cell to training. A move happens only when all of these hold:

* **hysteresis** — a rollout cell is released only if the remaining capacity still covers the demand
  plus ``hysteresis_slots``;
* **minimum dwell** — a cell keeps a role for at least ``min_dwell_s`` (so at most one move per cell per
  dwell, whatever the signals do);
* **rate limit** — at most ``max_moves_per_tick`` moves per decision;
* **staleness bound** — when a full batch waits and its oldest trajectory lags more than ``staleness_bound``
  versions, no cell is added to rollout (train what is there first; with less than a batch waiting,
  holding rollout back would only delay the batch that training needs);
* **switch-cost gate** — the idle time the move is expected to save, ``min(idle time left in the current
  role, work waiting in the target role)``, must exceed ``gate_margin`` × the measured switch cost
  (× 2 with ``round_trip``: the cell will likely come back). This is the rule of verl's dynamic
  resource controller: move only when the idle time saved exceeds a rolling mean of switch costs.

Starvation overrides the gate (not the dwell): a role with work waiting and no cell at all gets one.
With ``pin_core`` a core cell (the authoritative parameters) never leaves training.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from sapwood.platform.events.cells import CellRole
from sapwood.scheduler.policies.common import start_decision
from sapwood.scheduler.policy import Assignment, Decision
from sapwood.scheduler.signals import CellState, Signals


class ElasticPolicy:
    name = "elastic"

    def __init__(
        self,
        min_dwell_s: float = 60.0,
        max_moves_per_tick: int = 4,
        hysteresis_slots: int = 1,
        staleness_bound: int = 1,
        gate_margin: float = 1.0,
        round_trip: bool = True,
        switch_cost_prior_s: float = 10.0,
        min_train_cells: int = 1,
        max_staleness: int | None = None,
        pin_core: bool = False,
    ):
        checks = {
            "min_dwell_s": min_dwell_s >= 0,
            "max_moves_per_tick": max_moves_per_tick >= 1,
            "hysteresis_slots": hysteresis_slots >= 0,
            "staleness_bound": staleness_bound >= 0,
            "gate_margin": gate_margin >= 0,
            "switch_cost_prior_s": switch_cost_prior_s >= 0,
            "min_train_cells": min_train_cells >= 0,
        }
        bad = [k for k, ok in checks.items() if not ok]
        if bad:
            raise ValueError(f"ElasticPolicy: {bad} out of range (dwell/margin/prior ≥ 0, max_moves ≥ 1, counts ≥ 0)")
        self.min_dwell_s = min_dwell_s
        self.max_moves_per_tick = max_moves_per_tick
        self.hysteresis_slots = hysteresis_slots
        self.staleness_bound = staleness_bound
        self.gate_margin = gate_margin
        self.round_trip = round_trip
        self.switch_cost_prior_s = switch_cost_prior_s
        self.min_train_cells = min_train_cells
        #: core cells never leave training (the simulator sets this when its workload has core cells)
        self.pin_core = pin_core
        #: the admission bound the simulator enforces (defaults to the policy's staleness bound)
        self.max_staleness = staleness_bound if max_staleness is None else max_staleness

    def initial_assignment(self, cell_ids: Sequence[str]) -> dict[str, CellRole]:
        return dict.fromkeys(cell_ids, "rollout")

    # ---- estimates (all from observable signals) -------------------------------------------------
    def switch_cost(self, s: Signals) -> float:
        cost = s.switch_cost_mean_s if s.switch_cost_mean_s > 0 else self.switch_cost_prior_s
        return cost * (2.0 if self.round_trip else 1.0)

    @staticmethod
    def batch_eta_s(s: Signals) -> float:
        """Seconds until a full batch is finished, from the rolling completion rate (inf if unknown)."""
        missing = s.batch_size - s.backlog_executions
        if missing <= 0:
            return 0.0
        if missing > s.in_flight + s.rollout_demand or s.rollout_completions_per_s <= 0:
            return math.inf
        return missing / s.rollout_completions_per_s

    def train_work_s(self, s: Signals, n_train: int) -> float:
        """Seconds of training work one more train cell would find (current step + batches the data allows)."""
        pending_batches = (s.backlog_executions + s.in_flight) // s.batch_size
        work = s.train_remaining_cell_s + s.train_step_cell_s * pending_batches
        return work / (n_train + 1)

    def rollout_idle_s(self, s: Signals, n_train: int) -> float:
        """Seconds a surplus rollout cell would stay idle: until the policy version advances."""
        step_s = s.train_step_cell_s / max(n_train, 1)
        if s.train_active:
            return s.train_remaining_cell_s / max(n_train, 1)
        return self.batch_eta_s(s) + step_s

    @staticmethod
    def balanced_rollout_cells(s: Signals, n_cells: int, cap_cell: int) -> int:
        """Rollout cells r so that production r·cap/p50 matches consumption (n−r)·batch/step_cost."""
        if s.rollout_p50_s <= 0 or s.train_step_cell_s <= 0:
            return n_cells // 2
        produce = cap_cell / s.rollout_p50_s  # trajectories per second per rollout cell
        consume = s.batch_size / s.train_step_cell_s  # trajectories per second per train cell
        return round(n_cells * consume / (produce + consume))

    # ---- decision: one tick, in named steps ------------------------------------------------------
    def decide(self, signals: Signals, assignment: Assignment) -> Decision:
        """Starved roles first, then the rollout pool grown or shrunk toward :meth:`rollout_target`."""
        t = Tick.start(self, signals, assignment)
        self.feed_starved_roles(t)
        want_r = self.rollout_target(t)
        self.grow_rollout(t, want_r)
        self.shrink_rollout(t, want_r)
        return Decision(t.target, t.reasons)

    def feed_starved_roles(self, t: Tick) -> None:
        """A role with work waiting and no cell at all gets one (overrides the gate, not the dwell)."""
        s, floor = t.signals, max(self.min_train_cells, 1)
        if t.train_work and t.count("train") < floor:
            for cell in t.eligible("idle", "core") + t.eligible("rollout", "core"):
                if t.moves >= self.max_moves_per_tick or t.count("train") >= floor:
                    break
                t.move(cell, "train", f"starved: training work waiting with {t.count('train')} train cells")
        if s.rollout_demand > 0 and t.capacity() == 0 and not t.stale:
            for cell in t.eligible("idle", "satellite") + t.eligible("train", "satellite"):
                if t.moves >= self.max_moves_per_tick or t.capacity() > 0:
                    break
                if t.target[cell.cell_id] == "train" and t.train_work and t.count("train") <= self.min_train_cells:
                    continue
                t.move(cell, "rollout", f"starved: {s.rollout_demand} rollouts want a slot and no rollout cell")

    def rollout_target(self, t: Tick) -> int:
        """Rollout cells wanted: the demand (with ``hysteresis_slots`` of slack; at least one slot while
        executions run) caps the pool; when both roles have work, the production/consumption balance
        caps it too; a stale full batch freezes growth."""
        s, live = t.signals, t.live
        n_live = len(live)
        cap_cell = max(round(sum(c.capacity for c in live) / max(n_live, 1)), 1)
        # a running execution between two calls holds no slot but will call again: keep one cell for it
        demand = max(s.rollout_demand, 1 if s.in_flight > 0 else 0)
        demand_cells = math.ceil((demand + self.hysteresis_slots) / cap_cell) if demand else 0
        want_r = min(demand_cells, n_live)
        if t.train_work:
            want_r = min(want_r, max(self.balanced_rollout_cells(s, n_live, cap_cell), 1 if demand else 0))
            want_r = min(want_r, n_live - self.min_train_cells)
        if t.stale:
            want_r = min(want_r, t.count("rollout"))
        return want_r

    def grow_rollout(self, t: Tick, want_r: int) -> None:
        """Move idle, then train cells into rollout while demand exceeds capacity and the gate lets them."""
        s = t.signals
        for cell in t.eligible("idle", "satellite") + t.eligible("train", "satellite"):
            demand, cap = s.rollout_demand, t.capacity()
            if t.moves >= self.max_moves_per_tick or t.count("rollout") >= want_r or demand <= cap:
                break
            was = t.target[cell.cell_id]
            work_there = s.rollout_p50_s * min(1.0, (demand - cap) / cell.capacity)
            if was == "idle":
                saved, kind = work_there, "idle cell"
            elif t.train_work:
                saved, kind = work_there, "rebalance toward production"
            else:
                saved, kind = min(self.batch_eta_s(s), work_there), "train cell idle until the next batch"
            if saved > self.gate_margin * t.cost:
                t.move(cell, "rollout", (
                    f"{kind}: rollout demand {demand} > capacity {cap}, target {want_r} rollout cells; "
                    f"expected idle saved {saved:.0f}s > switch cost {t.cost:.0f}s"
                ))

    def shrink_rollout(self, t: Tick, want_r: int) -> None:
        """Move rollout cells to training: surplus capacity first, then rebalancing, each through the gate."""
        s = t.signals
        for cell in t.eligible("rollout", "satellite"):
            demand, cap = s.rollout_demand, t.capacity()
            if t.moves >= self.max_moves_per_tick or t.count("rollout") <= want_r:
                break
            n_train = t.count("train")
            surplus = cap - cell.capacity >= demand + self.hysteresis_slots
            if surplus:
                saved = min(self.rollout_idle_s(s, n_train), self.train_work_s(s, n_train))
                kind = f"surplus: capacity {cap} exceeds demand {demand} by ≥ {cell.capacity + self.hysteresis_slots}"
            elif t.train_work:
                saved, kind = self.train_work_s(s, n_train), "rebalance toward training"
            else:
                continue
            if saved > self.gate_margin * t.cost:
                t.move(cell, "train", (
                    f"{kind}, target {want_r} rollout cells; expected idle saved {saved:.0f}s > switch cost "
                    f"{t.cost:.0f}s"
                ))


@dataclass
class Tick:
    """One decision in progress: the roles it has set so far, why, and the moves it has made."""

    policy: ElasticPolicy
    signals: Signals
    target: dict[str, CellRole]
    reasons: dict[str, str]
    movable: list[str]
    cells: dict[str, CellState]
    live: list[CellState]
    train_work: bool
    """Training has work: a step runs or a full batch waits."""
    stale: bool
    """A full batch waits and its oldest trajectory lags more than the staleness bound."""
    cost: float
    """The switch cost a move must beat (× 2 with ``round_trip``)."""
    moves: int = 0

    @classmethod
    def start(cls, policy: ElasticPolicy, s: Signals, assignment: Assignment) -> Tick:
        target, reasons, movable = start_decision(s, assignment)
        return cls(policy, s, target, reasons, list(movable), {c.cell_id: c for c in s.cells},
                   [c for c in s.cells if not c.lost],
                   train_work=s.train_active or s.backlog_executions >= s.batch_size,
                   stale=s.backlog_executions >= s.batch_size and s.staleness_max > policy.staleness_bound,
                   cost=policy.switch_cost(s))

    def count(self, role: CellRole) -> int:
        """Live cells the decision has in ``role`` so far."""
        return sum(1 for c in self.live if self.target[c.cell_id] == role)

    def capacity(self) -> int:
        """Rollout slots of the live cells the decision has in rollout so far."""
        return sum(c.capacity for c in self.live if self.target[c.cell_id] == "rollout")

    def eligible(self, role: CellRole, prefer: str) -> list[CellState]:
        """Cells in ``role`` that may move now (dwell passed, not moved this tick, not a pinned core cell),
        the ``prefer`` tier first, then the longest in their role."""
        p = self.policy
        pool = [
            self.cells[cid]
            for cid in self.movable
            if self.target[cid] == role and self.signals.at_s - self.cells[cid].role_since_s >= p.min_dwell_s
            and cid not in self.reasons and not (p.pin_core and role == "train" and self.cells[cid].tier == "core")
        ]
        pool.sort(key=lambda c: (c.tier != prefer, c.role_since_s, c.cell_id))
        return pool

    def move(self, cell: CellState, role: CellRole, why: str) -> None:
        self.target[cell.cell_id] = role
        self.reasons[cell.cell_id] = why
        self.moves += 1
