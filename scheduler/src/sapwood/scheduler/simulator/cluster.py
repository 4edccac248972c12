"""The SimPy model: N homogeneous cells, long-tailed rollouts, data-parallel training, timed role switches.

Process layout (all SimPy processes, no hand-written event loop):

* one process per running rollout segment (a rollout preempted by a shrinking rollout pool keeps its
  remaining time and resumes first when a slot frees — the source's "switch without interrupting tasks");
* one trainer: waits for a full batch, then works off ``train_cell_s_per_step`` cell-seconds at a rate equal
  to the number of active train cells (cells joining or leaving mid-step change the rate), then waits
  ``train_step_serial_s`` (the step's part that more cells do not shorten; its train cells idle);
* one controller: every ``tick_s`` and on every state change, builds a :class:`Signals` snapshot from
  observable state only, calls the policy, and starts a switch process for every moved cell.

Admission control bounds staleness: rollout ``i`` may start only when ``i < (version + max_staleness + 1) ×
batch_size`` (exactly one batch per version when the bound is 0, i.e. Colocate). Which finished rollouts a
step consumes is the workload's ``batch_rule`` (see :mod:`sapwood.scheduler.simulator.workload`); dropped
stale rollouts raise the admission limit by one each, so a replacement is admitted.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

import numpy as np
import simpy

from sapwood.platform.events.cells import CellRole
from sapwood.scheduler.policy import Decision, Policy, check_decision, load_policy
from sapwood.scheduler.signals import CellState, Signals
from sapwood.scheduler.simulator.results import Move, SimResult, Switch
from sapwood.scheduler.simulator.workload import Workload

Proc = Generator[simpy.Event, Any, None]


@dataclass
class _Cell:
    cell_id: str
    tier: str
    role: CellRole
    role_since_s: float = 0.0
    switching: bool = False


@dataclass
class _Rollout:
    idx: int
    remaining: float
    duration: float
    version: int
    started_s: float
    seg_start: float = 0.0
    proc: Any = None


class ClusterSim:
    """One simulated run of ``workload`` under ``policy`` (durations drawn from ``seed``)."""

    def __init__(self, workload: Workload, policy: Policy, seed: int = 0):
        self.w = workload
        self.policy = policy
        self.seed = seed
        self.bound = int(getattr(policy, "max_staleness", workload.max_staleness))
        self.env = simpy.Environment()
        dropping = workload.batch_rule == "first_finished" and workload.stale_rollouts == "drop"
        self.pool = workload.rollouts * (4 if dropping else 1)
        self.durations = workload.durations(seed, self.pool)
        ids = [f"cell-{i:02d}" for i in range(workload.cells)]
        initial = policy.initial_assignment(ids)
        tiers = ["core" if i >= workload.cells - workload.core_cells else "satellite" for i in range(workload.cells)]
        #: core cells pinned to training (every policy that separates the roles; Colocate sets pins_core = False)
        self.pinned = {cid for cid, t in zip(ids, tiers, strict=True) if t == "core"} if pins_core(policy) else set()
        self.cells = [
            _Cell(cid, t, "train" if cid in self.pinned else initial[cid]) for cid, t in zip(ids, tiers, strict=True)
        ]
        self.streaming = workload.streaming_accumulation and bool(getattr(policy, "can_stream", True))
        self.refused_moves = 0  # moves of a pinned core cell out of training the simulator refused
        self.role_cell_s = {cid: dict.fromkeys(("rollout", "train", "idle", "switching"), 0.0) for cid in ids}
        self.train_working = False  # train cells have work in hand (what the train-busy accounting integrates)
        self.in_serial = False  # a step's serial part runs (its train cells idle, the run is not stalled)
        self.version = 0
        self.next_idx = 0
        self.running: dict[int, _Rollout] = {}
        self.paused: deque[_Rollout] = deque()
        self.backlog: dict[int, _Rollout] = {}  # finished, not yet consumed; insertion = finishing order
        self.completions = np.zeros(self.pool, dtype=np.int64)
        self.trained = np.zeros(self.pool, dtype=np.int64)
        self.staleness: list[int] = []
        self.weights: list[float] = []
        self.timed_out: dict[int, float] = {}  # rollout index -> partial score (fraction of its work done)
        self.dropped: list[int] = []  # staleness of each rollout dropped at consumption
        self.finished_at: deque[float] = deque()
        self.finished_durations: deque[float] = deque(maxlen=256)
        self._p50_memo: tuple[int, float] = (-1, math.nan)  # (completions seen, their median): one median per finish
        self._switch_memo: tuple[int, float] = (-1, 0.0)  # (switches logged, mean of the last 32)
        self._finished_count = 0
        self.switch_log: list[Switch] = []
        self.moves: list[Move] = []
        self.decisions = 0
        self.train_active = False
        self.train_remaining = 0.0
        self.last_step_s = 0.0
        self.wall_s = math.nan
        self.done = self.env.event()
        self._changed = self.env.event()
        self._acc_t = 0.0
        self._acc = dict.fromkeys(("rollout", "train", "idle", "switching", "rollout_busy", "train_busy"), 0.0)
        self.timeline: list[tuple[float, int, int, int, int]] = []

    # ---- bookkeeping -----------------------------------------------------------------------------
    def active(self, role: CellRole) -> int:
        return sum(1 for c in self.cells if c.role == role and not c.switching)

    def _account(self) -> None:
        """Integrate cell-seconds per role up to now; call before any change of roles or work."""
        dt = self.env.now - self._acc_t
        n_r, n_t, n_i = self.active("rollout"), self.active("train"), self.active("idle")
        n_s = sum(1 for c in self.cells if c.switching)
        if dt > 0:
            self._acc["rollout"] += dt * n_r
            self._acc["train"] += dt * n_t
            self._acc["idle"] += dt * n_i
            self._acc["switching"] += dt * n_s
            slots = self.w.slots_per_cell
            self._acc["rollout_busy"] += dt * min(len(self.running), n_r * slots) / slots
            self._acc["train_busy"] += dt * n_t * (1 if self.train_working else 0)
            for c in self.cells:
                self.role_cell_s[c.cell_id]["switching" if c.switching else c.role] += dt
        self._acc_t = self.env.now
        row = (self.env.now, n_r, n_t, n_i, n_s)
        if not self.timeline or self.timeline[-1][1:] != row[1:]:
            self.timeline.append(row)

    def _notify(self) -> None:
        """Wake the controller and the trainer (state changed)."""
        ev, self._changed = self._changed, self.env.event()
        ev.succeed()

    # ---- rollouts --------------------------------------------------------------------------------
    def capacity(self) -> int:
        return self.active("rollout") * self.w.slots_per_cell

    def admit_limit(self) -> int:
        limit = (self.version + self.bound + 1) * self.w.batch_size + len(self.dropped)
        return min(limit, self.w.rollouts + len(self.dropped), self.pool)

    def _fill(self) -> None:
        while len(self.running) < self.capacity():
            if self.paused:
                r = self.paused.popleft()
            elif self.next_idx < self.admit_limit():
                full = float(self.durations[self.next_idx])
                d = min(full, self.w.rollout_timeout_s)
                if d < full:
                    self.timed_out[self.next_idx] = d / full
                r = _Rollout(self.next_idx, d, d, self.version, self.env.now)
                self.next_idx += 1
            else:
                return
            self._start(r)

    def _shrink(self) -> None:
        """Preempt the newest segments until the running rollouts fit the capacity; they keep their progress."""
        while len(self.running) > self.capacity():
            r = max(self.running.values(), key=lambda x: (x.seg_start, x.idx))
            del self.running[r.idx]
            r.remaining = max(r.remaining - (self.env.now - r.seg_start), 0.0)
            self.paused.appendleft(r)
            r.proc.interrupt("preempted")

    def _start(self, r: _Rollout) -> None:
        r.seg_start = self.env.now
        self.running[r.idx] = r
        r.proc = self.env.process(self._run(r))

    def _run(self, r: _Rollout) -> Proc:
        try:
            yield self.env.timeout(r.remaining)
        except simpy.Interrupt:
            return
        self._account()
        del self.running[r.idx]
        self.completions[r.idx] += 1
        self.backlog[r.idx] = r
        self.finished_at.append(self.env.now)
        self.finished_durations.append(r.duration)
        self._finished_count += 1
        self._fill()
        self._notify()

    # ---- training --------------------------------------------------------------------------------
    def _trainer(self) -> Proc:
        w = self.w
        while self.version < w.steps:
            started = self.env.now
            if self.streaming:
                started = yield from self._streamed_step()
            else:
                yield from self._gather_batch()
                self._account()
                self.train_active = self.train_working = True
                self.train_remaining = w.train_cell_s_per_step
                started = self.env.now
                self._notify()
                self.train_remaining = yield from self._work_off(self.train_remaining)
            if w.train_step_serial_s > 0:  # the part of a step more train cells do not shorten
                self._account()
                self.train_working, self.in_serial = False, True
                yield self.env.timeout(w.train_step_serial_s)
                self.in_serial = False
            self._account()
            self.train_active = self.train_working = False
            self.train_remaining = 0.0
            self.version += 1
            self.last_step_s = self.env.now - started
            self._fill()
            self._notify()
        self.wall_s = self.env.now
        self.done.succeed()

    def _work_off(self, work: float, until_change: bool = False) -> Generator[simpy.Event, Any, float]:
        """Work off ``work`` cell-seconds at the rate of the active train cells; returns what is left
        (0 unless ``until_change``, which returns at the first state change)."""
        while work > 0:
            n = self.active("train")
            if n == 0:
                yield self._changed
                if until_change:
                    return work
                continue
            t0, done = self.env.now, self.env.timeout(work / n)
            yield done | self._changed
            work = 0.0 if done.processed else max(work - (self.env.now - t0) * n, 0.0)
            if until_change:
                return work
        return 0.0

    def _streamed_step(self) -> Generator[simpy.Event, Any, float]:
        """One step with streaming accumulation: each consumed rollout's share of the step is worked off as it
        arrives; the step ends when the whole batch is consumed and worked off. Returns the step's start."""
        w = self.w
        per = w.train_cell_s_per_step / w.batch_size
        taken, in_hand, started = 0, 0.0, self.env.now
        while taken < w.batch_size or in_hand > 0:
            got = self._take(w.batch_size - taken) if taken < w.batch_size else 0
            if got:
                if not self.train_active:
                    started = self.env.now
                self._account()
                taken, in_hand = taken + got, in_hand + got * per
                self.train_active = self.train_working = True
                self.train_remaining = in_hand + (w.batch_size - taken) * per
                self._notify()
            if in_hand <= 0:
                self._check_pool()
                yield self._changed
                continue
            left = yield from self._work_off(in_hand, until_change=True)
            self._account()
            in_hand = left
            self.train_working = in_hand > 0
            self.train_remaining = in_hand + (w.batch_size - taken) * per
        return started

    def _gather_batch(self) -> Proc:
        """Wait until one whole batch is consumable by the workload's batch rule, then consume it."""
        while True:
            if self.w.batch_rule == "first_finished" and self.w.stale_rollouts == "drop":
                self._drop_stale()
            ready = self._consumable()
            if len(ready) >= self.w.batch_size:
                self._take(self.w.batch_size)
                return
            self._check_pool()
            yield self._changed

    def _consumable(self) -> list[int]:
        """Backlog indices the current step may consume, in consumption order."""
        if self.w.batch_rule == "exact":
            lo = self.version * self.w.batch_size
            return [i for i in range(lo, lo + self.w.batch_size) if i in self.backlog]
        return list(self.backlog)

    def _drop_stale(self) -> None:
        """Drop every backlog rollout more than the bound stale (a replacement is admitted for each)."""
        for i in [i for i, r in self.backlog.items() if self.version - r.version > self.bound]:
            self._account()
            self.dropped.append(self.version - self.backlog.pop(i).version)
        self._fill()

    def _take(self, want: int) -> int:
        """Consume up to ``want`` rollouts available now by the batch rule; returns how many were trained."""
        if self.w.batch_rule == "first_finished" and self.w.stale_rollouts == "drop":
            self._drop_stale()
        taken = 0
        for i in self._consumable()[:want]:
            self._account()
            r = self.backlog.pop(i)
            excess = self.version - r.version - self.bound
            self._consume(r, self.w.stale_weight**excess if excess > 0 else 1.0)
            taken += 1
        return taken

    def _check_pool(self) -> None:
        if self.next_idx >= self.pool and not self.running and not self.paused:
            raise RuntimeError(f"simulator: rollout pool of {self.pool} exhausted by dropped stale rollouts")

    def _consume(self, r: _Rollout, weight: float) -> None:
        self.trained[r.idx] += 1
        self.staleness.append(self.version - r.version)
        self.weights.append(weight)

    # ---- control ---------------------------------------------------------------------------------
    def signals(self) -> Signals:
        now, w = self.env.now, self.w
        window = w.rollout_p50_s
        while self.finished_at and self.finished_at[0] < now - window:
            self.finished_at.popleft()
        elapsed = min(now, window)
        rate = len(self.finished_at) / elapsed if elapsed > 0 else 0.0
        in_flight = list(self.running.values()) + list(self.paused)
        seen = len(self.finished_durations) >= w.batch_size
        p50 = self._recent_p50() if seen else w.rollout_p50_s
        switch_mean = self._switch_cost_mean()
        stale = [self.version - r.version for r in self.backlog.values()]
        return Signals(
            at_s=now,
            cells=tuple(
                CellState(c.cell_id, c.tier, w.slots_per_cell, c.role, c.role_since_s, now, False, c.switching)  # type: ignore[arg-type]
                for c in self.cells
            ),
            batch_size=w.batch_size,
            backlog_executions=len(self.backlog),
            backlog_tokens=len(self.backlog) * w.tokens_per_rollout,
            in_flight=len(in_flight),
            in_flight_oldest_age_s=max((now - r.started_s for r in in_flight), default=0.0),
            rollout_demand=len(in_flight) + max(self.admit_limit() - self.next_idx, 0),
            train_active=self.train_active,
            train_remaining_cell_s=self.train_remaining if self.train_active else 0.0,
            train_step_cell_s=w.train_cell_s_per_step,
            rollout_p50_s=p50,
            rollout_completions_per_s=rate,
            rollout_tokens_per_s=rate * w.tokens_per_rollout,
            learner_tokens_per_s=(w.batch_size * w.tokens_per_rollout / self.last_step_s) if self.last_step_s else 0.0,
            policy_version=self.version,
            staleness_max=max(stale, default=0),
            staleness_mean=float(np.mean(stale)) if stale else 0.0,
            switch_cost_mean_s=switch_mean,
        )

    def _recent_p50(self) -> float:
        """Median of the last 256 finished rollouts' durations, recomputed only when one has finished."""
        if self._p50_memo[0] != self._finished_count:
            self._p50_memo = (self._finished_count, float(np.median(self.finished_durations)))
        return self._p50_memo[1]

    def _switch_cost_mean(self) -> float:
        """Mean measured duration of the last 32 switches (0 before any), recomputed only after a switch."""
        if self._switch_memo[0] != len(self.switch_log):
            recent = [s.duration_s for s in self.switch_log[-32:]]
            self._switch_memo = (len(self.switch_log), float(np.mean(recent)) if recent else 0.0)
        return self._switch_memo[1]

    def _switch(self, cell: _Cell, to: CellRole) -> Proc:
        self._account()
        old, cell.role, cell.switching = cell.role, to, True
        start = self.env.now
        self._shrink()
        self._notify()
        yield self.env.timeout(self.w.switch_cost_to(to))
        self._account()
        cell.switching, cell.role_since_s = False, self.env.now
        self.switch_log.append(Switch(cell.cell_id, old, to, start, self.env.now - start))
        self._fill()
        self._notify()

    def _apply(self, decision: Decision) -> None:
        assignment = {c.cell_id: c.role for c in self.cells}
        for c in self.cells:
            new = decision.target[c.cell_id]
            if c.cell_id in self.pinned and new != "train":
                self.refused_moves += 1
                continue
            if new != assignment[c.cell_id] and not c.switching:
                self.moves.append(Move(self.env.now, c.cell_id, c.role, new, decision.reasons.get(c.cell_id, "")))
                self.env.process(self._switch(c, new))

    def _controller(self) -> Proc:
        stalled_since: float | None = None
        while not self.done.triggered:
            s = self.signals()
            decision = check_decision(self.policy.decide(s, {c.cell_id: c.role for c in self.cells}), s)
            self.decisions += 1
            self._apply(decision)
            stalled_since = self._check_stall(stalled_since)
            yield self.env.timeout(self.w.tick_s) | self._changed | self.done

    def _check_stall(self, since: float | None) -> float | None:
        """Raise when nothing has run (no rollout, no training work, no step's serial part, no switch) for 10
        ticks: the policy left the run without a cell where the work is, so it would never finish."""
        busy = (self.running or any(c.switching for c in self.cells) or self.in_serial
                or (self.train_working and self.active("train")))
        if busy:
            return None
        if since is None:
            return self.env.now
        if self.env.now - since > 10 * self.w.tick_s:
            roles = {r: self.active(r) for r in ("rollout", "train", "idle")}
            raise RuntimeError(
                f"simulator: stalled since t={since:.0f}s under policy {getattr(self.policy, 'name', '?')!r} "
                f"(cells {roles}, backlog {len(self.backlog)}, version {self.version}): no cell where the work is"
            )
        return since

    def run(self) -> SimResult:
        self._account()
        self._fill()
        self.env.process(self._trainer())
        self.env.process(self._controller())
        self.env.run(until=self.done)
        self._account()
        a = self._acc
        idle = {
            "rollout": 1.0 - a["rollout_busy"] / a["rollout"] if a["rollout"] else 0.0,
            "train": 1.0 - a["train_busy"] / a["train"] if a["train"] else 0.0,
            "switching": a["switching"] / (self.wall_s * self.w.cells) if self.wall_s else 0.0,
        }
        return SimResult(
            policy=getattr(self.policy, "name", type(self.policy).__name__),
            seed=self.seed,
            steps=self.version,
            wall_s=self.wall_s,
            idle_fraction=idle,
            cell_seconds={k: a[k] for k in ("rollout", "train", "idle", "switching")},
            staleness=self.staleness,
            switches=self.switch_log,
            moves=self.moves,
            decisions=self.decisions,
            completions=self.completions,
            trained=self.trained,
            timeline=self.timeline,
            weights=self.weights,
            dropped=self.dropped,
            timed_out=self.timed_out,
            role_cell_s=self.role_cell_s,
            pinned=sorted(self.pinned),
            refused_moves=self.refused_moves,
        )


def pins_core(policy: Policy) -> bool:
    """Whether the simulator pins ``policy``'s core cells to training (all but colocated policies)."""
    return bool(getattr(policy, "pins_core", True))


def make_policy(name: str, workload: Workload, **kwargs: object) -> Policy:
    """A built-in policy configured for ``workload`` (staleness bound from the workload unless given; Elastic
    keeps core cells in training when the workload has any)."""
    if name in ("async", "elastic"):
        kwargs.setdefault("max_staleness", workload.max_staleness)
    if name == "elastic" and workload.core_cells:
        kwargs.setdefault("pin_core", True)
    return load_policy(name, **kwargs)


def simulate(workload: Workload, policy: Policy | str, seed: int = 0, **policy_kwargs: object) -> SimResult:
    """Run one simulation; ``policy`` is a policy object, a built-in name or an import path."""
    pol = make_policy(policy, workload, **policy_kwargs) if isinstance(policy, str) else policy
    return ClusterSim(workload, pol, seed).run()
