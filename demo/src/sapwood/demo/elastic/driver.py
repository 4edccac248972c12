"""``sapwood demo --elastic``: the elastic runtime end to end on the CPU (local Ray, SQLite store).

N cells (Ray actors) serve a key-recall task family whose rollout durations are long-tailed (each
execution's per-token latency is scaled by a Pareto draw); executions play on a few execution hosts; a
learner trains CompactionRL + SAO steps on what the store holds and publishes each version; each tick
a scheduler policy (``elastic``, ``colocate`` or the static ``async`` split) reads the signals and the
runtime moves cells with the switch protocol. The same seeds run under each schedule.

Cost model (said plainly): every cell does its real computation and is charged for it on its own device
clock (``runtime/device_clock.py``): ``decode_delay_s`` per generated token (× the execution's scale; a
batched step of k calls costs ``decode_delay_s + (k − 1) × batch_extra_s``) while serving, and
``train_microbatch_s`` per SAO micro-batch a cell computes in train. Training runs on the cells
(``runtime/cell_learner.py``): the core cell owns the learner; train cells claim the running step's
micro-batches, a cell entering train mid-step joins it; new weights reach the rollout cells by a
versioned broadcast in buckets over gloo. The calls, tokens, switches, store and learning are real.
"""

from __future__ import annotations

import json
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import ray
import torch

from sapwood.demo.config import DemoConfig
from sapwood.demo.critic_warmup import warm_critic_from_replay
from sapwood.demo.elastic.executions import ExecutionOutcome, ExecutionPool
from sapwood.demo.elastic.workload import LongTailWorkload
from sapwood.demo.phases import eval_tasks, evaluate, pretrained_policy
from sapwood.demo.pretrain import PretrainConfig
from sapwood.demo.tasks import KeyRecallEnv
from sapwood.learner.config import SourceConfig
from sapwood.learner.loop import latest_policy
from sapwood.platform import runs
from sapwood.platform.events import PolicyPublished
from sapwood.platform.storage.dialects import embedded_url
from sapwood.platform.store import Store
from sapwood.rollout.recorder import Recorder
from sapwood.rollout.torch_engine import LocalTorchEngine
from sapwood.rollout.transports import InProcessTransport
from sapwood.scheduler.policy import load_policy
from sapwood.scheduler.runtime.cluster import CellSpec, ElasticRuntime, init_ray
from sapwood.scheduler.runtime.device_clock import DeviceCosts
from sapwood.scheduler.signals import CellState, Signals, queue_demand

__all__ = ["SYNC_COLOCATE", "ElasticDemoConfig", "ScheduleResult", "admission_bound", "run_elastic_demo",
           "run_schedule", "schedule_policy", "static_splits"]

POLICY_ARGS: dict[str, dict[str, Any]] = {
    "elastic": {"min_dwell_s": 1.0, "switch_cost_prior_s": 0.2, "hysteresis_slots": 0, "staleness_bound": 1},
    "colocate": {"max_staleness": 1},
    "async": {"rollout_fraction": 0.67},
}
SYNC_COLOCATE = "colocate-sync"
"""The synchronous colocate (verl's colocated on-policy mode, the source's Colocate): every cell rolls out one
batch, then every cell trains on it; it admits one batch per policy version (bound 0) whatever the run's bound.
A reference arm of the comparison, not its baseline (``colocate``, admitting as every other arm does, is the
stronger one: decision 0058)."""
STATIC_PREFIX = "static-"
"""``static-R``: the static split with ``R`` rollout cells and the rest training (the ``async`` policy)."""


def static_splits(cells: int) -> tuple[str, ...]:
    """Every static split of ``cells`` cells: ``static-1`` … ``static-{cells − 1}`` (rollout cells)."""
    if cells < 2:
        raise ValueError(f"a static split needs ≥ 2 cells (one per role), got {cells}")
    return tuple(f"{STATIC_PREFIX}{r}" for r in range(1, cells))


def admission_bound(schedule: str, staleness_bound: int) -> int:
    """How many batches ahead of training ``schedule`` admits executions: the run's ``staleness_bound`` for
    every schedule but :data:`SYNC_COLOCATE` (0: one batch per policy version)."""
    return 0 if schedule == SYNC_COLOCATE else staleness_bound


def schedule_policy(schedule: str, cells: int, staleness_bound: int) -> tuple[str, dict[str, Any]]:
    """The policy name and arguments of a schedule name: ``elastic``, ``colocate``, :data:`SYNC_COLOCATE`,
    ``async`` (two thirds of the cells in rollout) or ``static-R`` (``R`` rollout cells, 1 ≤ R < ``cells``)."""
    if schedule.startswith(STATIC_PREFIX):
        tail = schedule[len(STATIC_PREFIX):]
        if not tail.isdigit() or not 1 <= int(tail) < cells:
            raise ValueError(f"schedule {schedule!r}: expected static-R with 1 ≤ R < {cells} rollout cells")
        return "async", {"rollout_cells": int(tail), "max_staleness": staleness_bound}
    if schedule == SYNC_COLOCATE:
        return "colocate", {"max_staleness": admission_bound(schedule, staleness_bound)}
    if schedule not in POLICY_ARGS:
        raise ValueError(f"unknown schedule {schedule!r}: expected elastic, colocate, {SYNC_COLOCATE}, async or "
                         f"static-R")
    args = dict(POLICY_ARGS[schedule])
    for key in ("staleness_bound", "max_staleness"):  # every schedule admits as the live run does
        if key in args:
            args[key] = staleness_bound
    return schedule, args


@dataclass(frozen=True)
class ElasticDemoConfig:
    """An elastic demo run; every schedule plays the same ``executions`` tasks with the same seeds."""

    seed: int = 0
    cells: int = 3
    capacity: int = 2
    executions: int = 48
    batch_size: int = 8
    decode_delay_s: float = 0.01
    tail_alpha: float = 1.3
    """Pareto shape of each execution's length scale (smaller: longer tail), clipped to ``tail_cap``;
    drawn per batch (:class:`~.workload.LongTailWorkload`: every batch has its tail)."""
    tail_cap: float = 12.0
    staleness_bound: int = 1
    """0 or 1: executions admitted at most ``batch_size × (1 + bound)`` ahead of training, every schedule."""
    batch_extra_s: float = 0.001
    train_microbatch_s: float = 0.25
    """Device seconds per trained micro-batch: the step's 1.5 device seconds over ``micro_batches``
    (``docs/scheduler.md``, *Device clocks*)."""
    micro_batches: int = 6
    """Micro-batches per training step (the cells claim them whole): 6 divides evenly over 1, 2 or 3 train
    cells, so a step on ``n`` ≤ 3 cells takes ``1 / n`` of its cell-seconds, as the simulator's fluid step does."""
    tick_s: float = 0.1
    grace_s: float = 0.05
    hosts: int = 2
    """Execution hosts (long-lived actors, each playing many executions)."""
    pin_cores: bool = True
    """Pin each cell to a core of its own where there are ≥ cells + 1 cores (``runtime/core_pinning.py``;
    not on a 2-core machine with 3 cells: there the device clocks alone keep cells apart)."""
    learner_backend: str = "torch"
    """The train cells' learner replicas: ``"torch"`` or ``"megatron"`` (megatron-core on the CPU)."""
    eval_executions: int = 64
    schedules: tuple[str, ...] = ("elastic", "async", "colocate")
    out_dir: Path | None = None
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)

    critic_warmup_steps: int = 0
    """Critic-only steps of each arm's learner before its first policy update (the critic arrives warmed from
    replay: ``critic_replay_executions``)."""
    critic_replay_executions: int = 128
    """Executions of policy version 0 replayed into critic-only steps before any arm starts, one step per
    ``batch_size`` (:mod:`sapwood.demo.critic_warmup`); every arm of a seed starts from the same warmed critic.
    0: none (the critic starts from random weights)."""

    @property
    def train_step_cell_s(self) -> float:
        """Device seconds of one training step on one cell."""
        return self.micro_batches * self.train_microbatch_s

    def device_costs(self) -> DeviceCosts:
        return DeviceCosts(decode_token_s=self.decode_delay_s, batch_extra_s=self.batch_extra_s,
                           train_microbatch_s=self.train_microbatch_s)

    def workload(self) -> LongTailWorkload:
        return LongTailWorkload(self.batch_size, self.tail_alpha, self.tail_cap, self.staleness_bound)

    def demo_config(self) -> DemoConfig:
        return DemoConfig(seed=self.seed, eval_executions=self.eval_executions, pretrain=self.pretrain, plots=False,
                          critic_warmup_steps=self.critic_warmup_steps)


@dataclass
class ScheduleResult:
    """What one schedule did: wall time, trained steps, the role timeline, switches and the store checks."""

    schedule: str
    wall_s: float
    steps: int
    outcomes: list[ExecutionOutcome]
    timeline: list[tuple[float, dict[str, str]]]
    switches: list[dict[str, Any]]
    router: dict[str, Any]
    store_check: dict[str, Any]
    rewards: list[float]
    final_state: dict[str, torch.Tensor]
    final_version: int
    occupancy: dict[str, float] = field(default_factory=dict)
    """Cell-seconds from the tick samples: ``rollout_cell_s``, ``rollout_slot_s`` (occupied slot-seconds),
    ``train_cell_s`` and ``train_device_s`` (trained micro-batches × their device seconds)."""
    step_walls: list[tuple[float, int]] = field(default_factory=list)
    """``(seconds, train cells at its start)`` of every training step (the learner step and the broadcast)."""
    slot_times: dict[str, dict[str, float]] = field(default_factory=dict)
    """Per execution id: ``waited_s`` (its calls waiting for a slot) and ``held_s`` (holding one), from the router."""
    step_log: list[dict[str, float]] = field(default_factory=list)
    """Per training step, seconds since the schedule's start: ``ready`` (a full batch waits and no step runs),
    ``started``,
    ``ended`` (the broadcast done), ``train_cells`` at its start, and seconds: ``assembly_s`` (the batch read from
    the store), ``update_s`` (the SAO step: micro-batches and update), ``broadcast_s`` (the weights broadcast)."""
    core_pins: dict[str, int] = field(default_factory=dict)
    """Cell id → the CPU core it was pinned to (empty: not enough cores to pin)."""
    admitted_ahead_max: int = 0
    """The most executions admitted and not yet trained at once (running plus finished-untrained): at most
    ``batch_size × (1 + admission bound)``."""

    def summary(self) -> dict[str, Any]:
        phases: dict[str, list[float]] = {}
        for sw in self.switches:
            for name, secs in sw["phases"].items():
                phases.setdefault(name, []).append(secs)
        third = max(len(self.rewards) // 3, 1)
        occ = self.occupancy
        return {
            "schedule": self.schedule, "wall_s": round(self.wall_s, 2), "steps": self.steps,
            "executions": len(self.outcomes), "switches": len(self.switches),
            "switch_phase_mean_s": {k: round(float(np.mean(v)), 4) for k, v in phases.items()},
            "calls_rerouted": int(self.router.get("rerouted", 0)),
            "attempts_aborted": int(self.router.get("aborted", 0)),
            "calls_sticky": int(self.router.get("sticky", 0)),
            "calls_left_sticky_cell": int(self.router.get("sticky_left", 0)),
            "slot_occupancy": _ratio(occ.get("rollout_slot_s", 0.0), occ.get("rollout_slot_capacity_s", 0.0)),
            "train_cell_occupancy": _ratio(occ.get("train_device_s", 0.0), occ.get("train_cell_s", 0.0)),
            "switch_overhead_cell_s": round(sum(sw["wall_s"] for sw in self.switches), 3),
            "cores_pinned": len(self.core_pins), "admitted_ahead_max": self.admitted_ahead_max,
            "execution_p50_s": _quantile([o.finished_at - o.started_at for o in self.outcomes], 0.5),
            **self.store_check,
            "train_reward_first_third": round(float(np.mean(self.rewards[:third])), 4) if self.rewards else None,
            "train_reward_last_third": round(float(np.mean(self.rewards[-third:])), 4) if self.rewards else None,
        }


def _ratio(num: float, den: float) -> float | None:
    return round(num / den, 4) if den > 0 else None


def _quantile(values: list[float], q: float) -> float | None:
    return round(float(np.quantile(values, q)), 4) if values else None


def _scales(cfg: ElasticDemoConfig) -> list[float]:
    return cfg.workload().scales(cfg.executions, cfg.seed)


def run_schedule(cfg: ElasticDemoConfig, schedule: str, state0: dict[str, torch.Tensor], out_dir: Path,
                 on_tick: Callable[[str, int, int], None] | None = None) -> ScheduleResult:
    """Train on ``cfg.executions`` executions with cells moved by policy ``schedule``."""
    dcfg = cfg.demo_config()
    model_cfg = dcfg.model_config()
    tag = f"elastic-{schedule}-s{cfg.seed}-{uuid.uuid4().hex[:6]}"
    rollout_run, train_run = tag, f"{tag}-learn"
    url = embedded_url(out_dir / f"{schedule}.db")
    store = Store.open(url)
    ckpt = out_dir / f"checkpoints-{schedule}"
    ckpt.mkdir(parents=True, exist_ok=True)
    torch.save({"model": state0, "policy_version": 0}, ckpt / "policy-v000000.pt")
    with store.transaction() as conn:
        runs.create_run(conn, train_run, runs.ExecutionFilter(run_id=rollout_run), kind="live", seed=cfg.seed,
                        description=f"sapwood demo --elastic ({schedule})")
    store.apply([PolicyPublished(run_id=train_run, version=0, checkpoint=str(ckpt / "policy-v000000.pt"))])
    name, args = schedule_policy(schedule, cfg.cells, cfg.staleness_bound)
    policy = load_policy(name, **args)
    ids = [f"cell-{i}" for i in range(cfg.cells)]
    first = policy.initial_assignment(ids)
    specs = [CellSpec(cid, capacity=cfg.capacity, role=first[cid], tier="core" if i == 0 else "satellite")
             for i, cid in enumerate(ids)]
    rt = ElasticRuntime(url, specs, model_cfg, state0, seed=cfg.seed, grace_s=cfg.grace_s,
                        policy_source=lambda: latest_policy(store, train_run), policy_name=schedule,
                        device_costs=cfg.device_costs(), pin_cores=cfg.pin_cores)
    ranks = rt.join_learner_group(micro_batches=cfg.micro_batches, learner_backend=cfg.learner_backend)
    core_id = ids[0]
    core = rt.cells[core_id]  # the learner lives on the core cell: optimizer, policy version, claims, commits
    lcfg = dcfg.learner_config()
    ray.get(core.start_trainer.remote(lcfg, state0, cfg.seed + 1))
    ray.get(core.start_learner.remote(
        url, train_run, learner_id=f"{tag}-learner", checkpoint_dir=str(ckpt),
        source_config=SourceConfig(jmax=dcfg.jmax, executions_per_batch=cfg.batch_size, train_summaries=True,
                                   seed=cfg.seed)))
    pool = ExecutionPool(dcfg.task, rt.router, rt.writer, run_id=rollout_run, seed=cfg.seed, hosts=cfg.hosts)
    pool.ready()  # the hosts start once, before the clock starts (like the cells)
    tasks = [KeyRecallEnv(dcfg.task).sample_task(np.random.default_rng([cfg.seed, 31, i]), task_id=f"task-{i}")
             for i in range(cfg.executions)]
    scales = _scales(cfg)
    max_staleness = admission_bound(schedule, cfg.workload().staleness_bound)  # as the simulated arm admits
    outcomes: list[ExecutionOutcome] = []
    timeline: list[tuple[float, dict[str, str]]] = []
    rewards: list[float] = []
    role_since = dict.fromkeys(ids, 0.0)
    training: dict[str, Any] = {"thread": None, "started": 0.0, "trained": 0, "steps": 0, "error": None}
    occupancy = dict.fromkeys(("rollout_cell_s", "rollout_slot_s", "rollout_slot_capacity_s", "train_cell_s"), 0.0)
    step_walls: list[tuple[float, int]] = []
    step_log: list[dict[str, float]] = []
    last_sample: tuple[float, dict[str, str], dict[str, int]] | None = None
    ahead_max = 0
    t0 = time.perf_counter()

    def train_step(train_cells: int) -> None:
        try:
            t_step = time.perf_counter()
            metrics = ray.get(core.learner_step.remote(5.0))
            if metrics is not None:
                training["trained"] += int(metrics.get("learner/executions", 0))
                training["steps"] += 1
                rewards.append(float(metrics.get("learner/rewards_mean", 0.0)))
                # the new version reaches the serving cells by a versioned broadcast in buckets (gloo)
                serving = [c for c, r in rt.roles.items() if r == "rollout" and c != core_id]
                t_cast = time.perf_counter()
                ray.get([core.broadcast_weights.remote([ranks[c] for c in serving]),
                         *[rt.cells[c].receive_weights.remote() for c in serving]])
                step_walls.append((time.perf_counter() - t_step, train_cells))
                step_log[-1].update(ended=time.perf_counter() - t0, broadcast_s=time.perf_counter() - t_cast,
                                    assembly_s=float(metrics.get("learner/assembly_s", 0.0)),
                                    update_s=float(metrics.get("learner/step_s", 0.0)))
        except BaseException as exc:
            training["error"] = exc

    try:
        next_task = 0
        while training["trained"] < cfg.executions:
            now = time.perf_counter() - t0
            if training["error"] is not None:
                raise training["error"]
            finished = len(outcomes)
            backlog = finished - training["trained"]
            in_flight = len(pool.running)
            admit = cfg.batch_size * (1 + max_staleness)
            while next_task < len(tasks) and backlog + len(pool.running) < admit:
                pool.start(tasks[next_task], decode_scale=scales[next_task])
                next_task += 1
            ahead_max = max(ahead_max, backlog + len(pool.running))
            outcomes += pool.poll(timeout_s=0)
            thread = training["thread"]
            active = thread is not None and thread.is_alive()
            train_cells = [c for c, r in rt.roles.items() if r == "train"]
            batch_ready = backlog >= min(cfg.batch_size, cfg.executions - training["trained"])
            if batch_ready and not active and training.get("ready") is None:
                training["ready"] = now
            if not active and train_cells and batch_ready:
                training["started"] = now
                step_log.append({"ready": training.pop("ready"), "started": now, "train_cells": len(train_cells)})
                thread = threading.Thread(target=train_step, args=(len(train_cells),), daemon=True)
                training["thread"] = thread
                thread.start()
                active = True
            remaining = max(cfg.train_step_cell_s - (now - training["started"]) * max(len(train_cells), 1), 0.0)
            done_rate = finished / now if now > 0 else 0.0
            durations = [o.finished_at - o.started_at for o in outcomes if o.finished_at > 0]
            costs = [sum(s["phases"].values()) for s in (_switch_json(r) for r in rt.coordinator.reports)]
            queue = ray.get(rt.router.queue.remote())
            if last_sample is not None:  # the interval since the last tick, at the last tick's state
                _accumulate(occupancy, now - last_sample[0], last_sample[1], last_sample[2], cfg.capacity)
            last_sample = (now, dict(rt.roles), {c: int(n) for c, n in queue["occupied"].items()})
            cells = tuple(CellState(cell_id=c, tier=rt.specs[c].tier, capacity=cfg.capacity, role=rt.roles[c],
                                    role_since_s=role_since[c], occupied=int(queue["occupied"].get(c, 0)))
                          for c in ids)
            signals = Signals(
                at_s=now, batch_size=cfg.batch_size, backlog_executions=backlog, in_flight=in_flight,
                rollout_demand=queue_demand(int(queue["waiting"]), cells), rollout_waiting=int(queue["waiting"]),
                train_active=active, train_remaining_cell_s=remaining if active else 0.0,
                train_step_cell_s=cfg.train_step_cell_s,
                rollout_p50_s=float(np.median(durations)) if durations else 0.0,
                rollout_completions_per_s=done_rate, policy_version=training["steps"],
                switch_cost_mean_s=float(np.mean(costs[-8:])) if costs else 0.0, cells=cells)
            decision = policy.decide(signals, dict(rt.roles))
            # cells enter rollout before others leave it, so that a leaving cell's aborted calls have a target
            moves = sorted(decision.moves(dict(rt.roles)).items(), key=lambda m: (m[1][1] != "rollout", m[0]))
            for cid, (_, new) in moves:  # a cell entering train joins the running step (runtime/cell_learner.py)
                rt.assign(cid, new, reason=decision.reasons.get(cid, ""), signals={"at_s": now, "backlog": backlog})
                role_since[cid] = time.perf_counter() - t0
            timeline.append((now, dict(rt.roles)))
            if on_tick is not None:
                on_tick(schedule, training["trained"], cfg.executions)
            outcomes += pool.poll(timeout_s=cfg.tick_s)
        wall = time.perf_counter() - t0
        thread = training["thread"]
        if thread is not None:
            thread.join()
        outcomes += pool.poll(timeout_s=30) if pool.running else []
        router_stats = ray.get(rt.router.stats.remote())
        slot_times = ray.get(rt.router.session_times.remote())
        check: dict[str, Any] = {**store_check(rt, outcomes)}
        final_version, final = ray.get(core.learner_state.remote())
        group = ray.get(core.group_stats.remote())
        check["satellite_micro_batches"] = sum(n for per in group["accepted"].values() for r, n in per.items() if r)
        check["core_micro_batches"] = sum(per.get(0, 0) for per in group["accepted"].values())
        check["stale_refused"] = len(group["refused"])
        check["learner_replica"] = group["replica"]
        if last_sample is not None:
            _accumulate(occupancy, wall - last_sample[0], last_sample[1], last_sample[2], cfg.capacity)
        trained_micro_batches = sum(n for per in group["accepted"].values() for n in per.values())
        occupancy["train_device_s"] = trained_micro_batches * cfg.train_microbatch_s
        return ScheduleResult(schedule, wall, training["steps"], outcomes, timeline,
                              [_switch_json(r) for r in rt.coordinator.reports], router_stats, check, rewards,
                              final, final_version, occupancy, step_walls, slot_times, step_log, dict(rt.core_pins),
                              ahead_max)
    finally:
        pool.close()
        ray.get(core.close_learner.remote())
        rt.shutdown()
        store.close()


def _accumulate(acc: dict[str, float], dt: float, roles: dict[str, str], occupied: dict[str, int],
                capacity: int) -> None:
    """Add ``dt`` seconds at one tick's state: rollout and train cell-seconds, occupied and offered slot-seconds."""
    if dt <= 0:
        return
    for cid, role in roles.items():
        if role == "rollout":
            acc["rollout_cell_s"] += dt
            acc["rollout_slot_capacity_s"] += dt * capacity
            acc["rollout_slot_s"] += dt * min(occupied.get(cid, 0), capacity)
        elif role == "train":
            acc["train_cell_s"] += dt


def _switch_json(rep: Any) -> dict[str, Any]:
    return {"cell_id": rep.cell_id, "from": rep.from_role, "to": rep.to_role, "phases": dict(rep.phases),
            "aborted_calls": rep.aborted_calls, "at": rep.started_at, "wall_s": rep.wall_s}


def store_check(rt: ElasticRuntime, outcomes: list[ExecutionOutcome]) -> dict[str, int]:
    """Calls lost / duplicated (completed calls the executions saw vs. calls the store holds, per execution),
    environments reset beyond their start, executions missing from the store or not finished."""
    by_id = {eid: (ex.status, ex.n_calls) for eid, ex in rt.executions().items()}
    lost = dup = missing = unfinished = 0
    for o in outcomes:
        got = by_id.get(o.execution_id)
        if got is None:
            missing += 1
            continue
        status, n = got
        unfinished += status == "running"
        lost += max(o.calls - n, 0)
        dup += max(n - o.calls, 0)
    return {"calls_lost": lost, "calls_duplicated": dup, "envs_reset": sum(max(o.resets - 1, 0) for o in outcomes),
            "executions_missing": missing, "executions_unfinished": unfinished,
            "executions_error": sum(o.status == "error" for o in outcomes)}


def _eval(cfg: ElasticDemoConfig, state: dict[str, torch.Tensor], version: int, phase: str, out_dir: Path) -> float:
    dcfg = cfg.demo_config()
    store = Store.open(embedded_url(out_dir / "eval.db"))
    try:
        rec = Recorder(InProcessTransport(store, batch_size=256), run_id=f"eval-{phase}", engine="local-torch",
                       vocab_size=dcfg.model_config().vocab_size, task_family="key-recall")
        engine = LocalTorchEngine(dcfg.model_config(), state=state, policy_version=version, seed=cfg.seed)
        reports = evaluate(dcfg, engine, rec, eval_tasks(dcfg), phase)
        rec.close()
        return float(np.mean([r.reward for r in reports]))
    finally:
        store.close()


def run_elastic_demo(cfg: ElasticDemoConfig, *, on_tick: Callable[[str, int, int], None] | None = None,
                     ray_address: str | None = None,
                     keep: dict[str, ScheduleResult] | None = None) -> dict[str, Any]:
    """Every schedule on the same seeds; returns the JSON summary (and writes plots into ``out_dir``);
    ``keep`` receives each schedule's :class:`ScheduleResult`."""
    from sapwood.demo.elastic.plots import plot_elastic

    t_start = time.perf_counter()
    out_dir = Path(cfg.out_dir) if cfg.out_dir else Path(tempfile.mkdtemp(prefix="sapwood-elastic-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    timings: dict[str, float] = {}
    t = time.perf_counter()
    state0, _, _ = pretrained_policy(cfg.demo_config())
    timings["pretrain_s"] = time.perf_counter() - t
    state0, warmup = warm_critic_from_replay(cfg.demo_config(), state0, cfg.critic_replay_executions, cfg.batch_size,
                                             out_dir)
    timings["critic_warmup_s"] = warmup.seconds
    t = time.perf_counter()
    init_ray(ray_address)
    timings["ray_init_s"] = time.perf_counter() - t
    t = time.perf_counter()
    start_reward = _eval(cfg, state0, 0, "eval-start", out_dir) if cfg.eval_executions else None
    timings["eval_s"] = time.perf_counter() - t
    results = {}
    for name in cfg.schedules:
        t = time.perf_counter()
        results[name] = run_schedule(cfg, name, state0, out_dir, on_tick)
        timings[f"{name}_total_s"] = time.perf_counter() - t
    if keep is not None:
        keep.update(results)
    summary: dict[str, Any] = {"config": {k: v for k, v in vars(replace(cfg, out_dir=None)).items()
                                          if k not in ("pretrain",)},
                               "eval_reward_start": start_reward, "critic_warmup": warmup.to_json(),
                               "schedules": {}}
    for name, res in results.items():
        s = res.summary()
        if cfg.eval_executions:
            s["eval_reward_end"] = _eval(cfg, res.final_state, res.final_version, f"eval-end-{name}", out_dir)
        summary["schedules"][name] = s
    if "elastic" in results:
        for other in ("async", "colocate"):
            if other in results:
                summary[f"wall_{other}_over_elastic"] = round(results[other].wall_s / results["elastic"].wall_s, 3)
    summary["plots"] = [str(p) for p in plot_elastic(results, out_dir)]
    summary["out_dir"] = str(out_dir)
    summary["timings_s"] = {k: round(v, 1) for k, v in timings.items()}
    summary["total_s"] = round(time.perf_counter() - t_start, 1)
    (out_dir / "summary.json").write_text(json.dumps(summary))  # kept whatever a caller does next
    return summary
