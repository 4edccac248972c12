"""Training chaos campaign: kill -9 rollout workers, ingest, learners and the live scheduler of a real run, then
prove from the store that every prompt sample was rolled out once and every finished execution trained
exactly once; and compare the evaluation reward with a no-fault run of the same seed and dataset.

A fresh run gets ``prompts`` synthetic prompts × ``samples`` samples (``sapwood.platform.prompts``);
``workers`` rollout worker processes (``python -m sapwood.rollout.prompt_worker``) claim and record them
straight into the store, and ``learners`` ``sapwood learn`` processes train the run's finished executions
concurrently (each commit races the others for the next version; the loser rolls back and reloads). Each
learner slot has a stable ``--identity``, so its restart takes the dead process's claims over at once
instead of waiting out their lease. With
``kafka``, the workers record through Kafka (a fresh 4-partition topic) and ``ingests`` ``sapwood ingest``
processes apply the events; a worker keeps each sample's lease until ingest stored its finished execution.
With ``scheduler``, one ``sapwood scheduler run`` process (the live loop, elastic policy, logging actuator)
decides the roles of :data:`SCHEDULER_CELLS` registered cells every :data:`SCHEDULER_TICK_S` seconds from
the run's live signals and records each decision (through Kafka with ``kafka``). While they run, the
supervisor SIGKILLs a random process (:func:`pick_victim`: past its start-up, preferably not armed with a
fault point; one of a kind not yet killed first, and the last kills kept for the kinds not killed yet) at
random points of its progress
(``kills``) and restarts every process that dies; each fault point of the learner, the worker and (with
Kafka) ingest (``SAPWOOD_FAULT``) is armed on two (re)starts, so those processes kill themselves there.

Afterwards, from the store alone: every sample has exactly one finished attempt (abandoned attempts are
re-issued, kept, never queued for training); the rollout lengths (model calls) of re-issued samples'
finished executions against the others' (KS distance, permutation p-value: ``sapwood.learner.length_bias``);
and the exactly-once audit of the training run (:func:`sapwood.learner.audit.audit_training`): 0 skipped,
0 duplicated, contiguous versions, every published checkpoint loads with its digest, trainer step counts
consistent. Recovery per kill: seconds from the death until that kind of process makes progress again (a
sample done for workers and ingest, a version published for learners, a decision tick logged for the
scheduler).

With ``compare``, the same campaign runs again with no kill and no fault point (same seed, same prompts,
a new run id), and the evaluation reward (:mod:`sapwood.demo.chaos.evaluation`) of the published
checkpoints of both runs is drawn in ``reward_curves.png`` with a mark at each death of the chaos run.

The elastic runtime's fault point ``runtime.mid_switch`` fires in ``mid_switch_rounds`` crash rounds after the
run (:mod:`sapwood.demo.chaos.mid_switch`: a small Ray runtime on its own SQLite store, the switch's live-loop
process killed between aborting a cell's calls and rerouting them, a restart that repairs the half-done
switch and then redoes the move or keeps the cell; every call stored once). The campaign's run has no Ray
runtime (its workers are processes that claim from the prompt queue), so the rounds run beside it, not
inside it; their deaths count in ``fault_deaths``. Each attempt's length is drawn afresh
(``prompt_worker.attempt_length``), so the length check detects a queue that favours short rollouts on
re-issue, not the (expected) fact that long attempts are killed more often.
"""

from __future__ import annotations

import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sapwood.demo.chaos.restart_parts import restart_parts, summarize
from sapwood.learner.audit import audit_training
from sapwood.learner.length_bias import length_bias
from sapwood.platform import runs
from sapwood.platform.errors import StoreUnavailableError
from sapwood.platform.events import CellRegistered
from sapwood.platform.prompts import PromptRow, add_prompts, prompt_progress
from sapwood.platform.storage.backends import prompt_queue
from sapwood.platform.storage.learner_reads import policy_history, run_item_states
from sapwood.platform.store import Store

__all__ = ["pick_victim", "run_campaign"]

LEARNER_POINTS = ("learner.after_step", "learner.after_checkpoint", "learner.in_commit")
WORKER_POINTS = ("rollout.after_claim", "rollout.mid_recording")
INGEST_POINTS = ("ingest.after_apply",)
#: Seconds a process runs before it may be picked for a random kill.
STARTUP_S = {"worker": 1.0, "learner": 6.0, "ingest": 3.0, "scheduler": 2.0}
#: Whose progress shows a kind of process recovered: ingest's is the samples it lets finish.
PROGRESS_OF = {"worker": "worker", "learner": "learner", "ingest": "worker", "scheduler": "scheduler"}
#: Cells registered for the live scheduler to assign, and its seconds between decisions.
SCHEDULER_CELLS = 4
SCHEDULER_TICK_S = 0.5
_SAPWOOD = [sys.executable, "-c", "from sapwood.platform.cli import main; main()"]


@dataclass
class Proc:
    kind: str  # "worker" | "learner" | "ingest" | "scheduler"
    slot: int
    popen: subprocess.Popen[bytes]
    fault: str | None
    started: float
    log: Path
    started_wall: float = 0.0
    ticks: int = 0
    """Decision ticks the process logged so far (the scheduler)."""


@dataclass
class Campaign:
    url: str
    run_id: str
    out: Path
    lease_s: float
    call_s: float
    kafka: tuple[str, str] | None = None
    """(bootstrap, topic) when the workers record through Kafka and ingest processes apply the events."""
    procs: list[Proc] = field(default_factory=list)
    generation: Counter[str] = field(default_factory=Counter)
    deaths: list[dict[str, Any]] = field(default_factory=list)
    pending_faults: dict[str, list[str]] = field(default_factory=dict)
    spawned: list[Proc] = field(default_factory=list)
    """Every process started, in order (the dead ones too)."""

    def command(self, kind: str, slot: int, name: str) -> list[str]:
        if kind == "worker":
            return [sys.executable, "-m", "sapwood.rollout.prompt_worker", self.url, self.run_id, name,
                    str(self.lease_s), "4", "3", str(self.call_s), *(self.kafka or ())]
        if kind == "ingest":
            assert self.kafka is not None
            bootstrap, topic = self.kafka
            return [sys.executable, "-m", "sapwood.ingest", "--database-url", self.url, "--bootstrap", bootstrap,
                    "--topic", topic, "--group", f"{topic}-ingest", "--batch-size", "50", "--partitions", "0",
                    "--dead-letter-topic", f"{topic}.dlq"]
        if kind == "scheduler":
            via = [] if self.kafka is None else ["--bootstrap", self.kafka[0], "--topic", self.kafka[1],
                                                 "--group", f"{self.kafka[1]}-ingest"]
            return [*_SAPWOOD, "scheduler", "run", "--database-url", self.url, *via, "--policy", "elastic",
                    "--batch-size", "4", "--tick-s", str(SCHEDULER_TICK_S), "--lost-after-s", "1e9"]
        return [*_SAPWOOD, "learn", "--database-url", self.url, "--run", self.run_id, "--executions-per-batch", "4",
                "--critic-warmup-steps", "0", "--lease-s", str(self.lease_s), "--checkpoint-dir",
                str(self.out / "checkpoints"), "--checkpoint-grace-s", "60", "--idle-timeout", "10",
                "--max-steps", "100000", "--threads", "1", "--vocab-size", "500", "--identity", f"learner{slot}"]

    def spawn(self, kind: str, slot: int) -> Proc:
        self.generation[kind] += 1
        fault = None
        queue = self.pending_faults.get(kind, [])
        if queue:  # every (re)start takes the next armed fault point until none is left
            fault = queue.pop(0)
        env = {**os.environ}
        env.pop("SAPWOOD_FAULT", None)
        if fault:
            env["SAPWOOD_FAULT"] = fault
        name = f"{kind}{slot}-{self.generation[kind]}"
        path = self.out / f"{name}.log"
        log = open(path, "wb")  # noqa: SIM115 (the child owns it)
        p = Proc(kind, slot, subprocess.Popen(self.command(kind, slot, name), env=env, stdout=log,
                                              stderr=subprocess.STDOUT), fault, time.monotonic(), path,
                 time.time())
        self.procs.append(p)
        self.spawned.append(p)
        return p


def pick_victim(procs: list[Proc], hit: set[str], kills_left: int, now: float, rng: random.Random) -> Proc | None:
    """The process the next random kill hits, or None to wait for one (``now``: monotonic seconds).

    Only processes past their start-up (:data:`STARTUP_S`; the scheduler also past its first decision tick)
    are candidates, and of those the ones not armed with a fault point (they kill themselves there) come
    first. A kind not yet killed (``hit``: the kinds already killed by kill -9) goes first, so every kind dies
    at least once: if all its ready processes are armed, one of them is killed (the caller arms its successor
    with the fault point). Once only as many kills are left as kinds not killed yet, they are kept for those
    kinds. A campaign's learners stay armed for most of a short run (six fault points), so without the armed
    fallback their kill waited for the end of the run, and a run could finish a kill short.
    """
    ready = [p for p in procs if now - p.started > STARTUP_S[p.kind] and (p.kind != "scheduler" or p.ticks > 0)]
    unarmed = [p for p in ready if p.fault is None]
    untouched = [p for p in unarmed if p.kind not in hit] or [p for p in ready if p.kind not in hit]
    if untouched:
        return rng.choice(untouched)
    waiting = {p.kind for p in procs} - hit
    if kills_left > len(waiting) and unarmed:
        return rng.choice(unarmed)
    return None


def _progress(store: Store, run_id: str) -> tuple[int, int, int, int]:
    """(samples done, samples total, newest published version (0: none), run items not done)."""
    with store.transaction() as conn:
        prog = prompt_progress(conn, run_id)
        runs.sync_run(conn, run_id)
        items = run_item_states(conn, run_id)
        history = policy_history(conn, run_id)
    done = sum(e["done"] for e in prog.values())
    total = sum(e["pending"] + e["claimed"] + e["done"] for e in prog.values())
    return done, total, history[-1][0] if history else 0, sum(1 for s in items.values() if s != "done")


def _ticks(log: Path) -> int:
    try:
        return log.read_bytes().count(b": tick ")
    except OSError:
        return 0


def kafka_topic(bootstrap: str, partitions: int = 4) -> str:
    """A fresh topic for the campaign's events."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from kafka import KafkaAdminClient
    topic = f"chaos-training-{uuid.uuid4().hex[:8]}"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="sapwood-chaos-training")
    try:
        admin.create_topics({topic: {"num_partitions": partitions}}, wait_for_metadata=True)
    finally:
        admin.close()
    return topic


@dataclass
class _Outcome:
    figures: dict[str, Any]
    deaths: list[dict[str, Any]]


def _run_once(url: str, out: Path, *, prompts: int, samples: int, workers: int, learners: int, kills: int,
              seed: int, lease_s: float, call_s: float, max_seconds: float, kafka: str | None, ingests: int,
              scheduler: bool, faults: bool, mid_switch_rounds: int = 0) -> _Outcome:
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    run_id = f"chaos-{uuid.uuid4().hex[:8]}"
    store = Store.open(url)
    with store.transaction() as conn:
        runs.create_run(conn, run_id, runs.ExecutionFilter(run_id=run_id), kind="live", seed=seed)
        add_prompts(conn, run_id, [PromptRow(f"prompt {i}", f"task-{i}", "chaos", {"i": i}) for i in range(prompts)],
                    samples_per_prompt=samples)
    if scheduler:
        store.apply([CellRegistered(cell_id=f"{run_id}-cell{i}", tier="core", capacity=2,
                                    metadata={"campaign": run_id}) for i in range(SCHEDULER_CELLS)])
    c = Campaign(url, run_id, out, lease_s, call_s, (kafka, kafka_topic(kafka)) if kafka else None)
    if faults:
        c.pending_faults = {"learner": [f"{p}@{rng.randint(1, 2)}" for _ in range(2) for p in LEARNER_POINTS],
                            "worker": [f"{p}@{rng.randint(1, 3)}" for _ in range(2) for p in WORKER_POINTS]}
        if kafka:
            c.pending_faults["ingest"] = [f"{p}@{rng.randint(1, 3)}" for _ in range(2) for p in INGEST_POINTS]
    t0 = time.monotonic()
    for i in range(ingests if kafka else 0):
        c.spawn("ingest", i)
    if scheduler:
        c.spawn("scheduler", 0)
    for i in range(workers):
        c.spawn("worker", i)
    for i in range(learners):
        c.spawn("learner", i)
    progress_at: dict[str, list[float]] = {"worker": [], "learner": [], "scheduler": []}
    last = (0, 0)
    killed = 0
    # the random kills come at random points of the run's progress (samples done + executions trained, over
    # twice the samples), so they spread over the whole run however fast it goes
    kill_at = sorted(rng.uniform(0.02, 0.95) for _ in range(kills))
    finished = False
    try:
        while time.monotonic() - t0 < max_seconds:
            try:
                done, total, version, untrained = _progress(store, run_id)
            except StoreUnavailableError:  # the poll hit the statement timeout under load: poll again
                time.sleep(1.0)
                continue
            now = time.monotonic()
            if done > last[0]:
                progress_at["worker"].append(now)
            if version > last[1]:
                progress_at["learner"].append(now)
            last = (done, version)
            for p in c.procs:
                if p.kind == "scheduler" and (n := _ticks(p.log)) > p.ticks:
                    p.ticks = n
                    progress_at["scheduler"].append(now)
            if done == total and untrained == 0:
                finished = True
                break
            for p in list(c.procs):
                rc = p.popen.poll()
                if rc is None:
                    continue
                c.procs.remove(p)
                if rc == -9:
                    c.deaths.append({"kind": p.kind, "at": now, "wall": time.time(), "cause": p.fault or "kill -9",
                                     "version": version})
                elif rc != 0:
                    raise RuntimeError(f"{p.kind} {p.slot} exited {rc}; see {p.log}")
                c.spawn(p.kind, p.slot)
            trained = max(done - untrained, 0)
            if killed < kills and (done + trained) / max(2 * total, 1) >= kill_at[killed]:
                hit = {d["kind"] for d in c.deaths if d["cause"] == "kill -9"}
                victim = pick_victim(c.procs, hit, kills - killed, now, rng)
                if victim is not None:
                    victim.popen.kill()
                    victim.popen.wait()
                    c.procs.remove(victim)
                    c.deaths.append({"kind": victim.kind, "at": time.monotonic(), "wall": time.time(),
                                     "cause": "kill -9", "version": version})
                    killed += 1
                    if victim.fault is not None:  # its fault point was not reached: its successor is armed with it
                        c.pending_faults[victim.kind].insert(0, victim.fault)
                    c.spawn(victim.kind, victim.slot)
            time.sleep(0.2)
    finally:  # every process of the campaign ends with it, also when it fails
        for p in c.procs:
            p.popen.kill()
            p.popen.wait()
    elapsed = time.monotonic() - t0
    mid_switch: list[dict[str, Any]] = []
    if faults and mid_switch_rounds:
        from sapwood.demo.chaos.mid_switch import run_rounds

        mid_switch = [r.to_json() for r in run_rounds(out / "mid-switch", mid_switch_rounds)]

    # -- the proof, from the store alone --------------------------------------------------------------
    with store.transaction() as conn:
        attempts = prompt_queue(conn).attempts(conn, run_id)
        progress = prompt_progress(conn, run_id)
        queued = run_item_states(conn, run_id)
        lengths = length_bias(conn, attempts, seed=seed)
        history = policy_history(conn, run_id)
    finished_by_sample = Counter(a["sample_id"] for a in attempts if a["state"] == "finished")
    all_samples = {f"{i}:0:{s}" for i in range(prompts) for s in range(samples)}
    abandoned = {a["execution_id"] for a in attempts if a["state"] == "abandoned"}
    audit = audit_training(store, run_id)
    store.close()
    recovery: dict[str, dict[str, float | int]] = {}
    for kind in ("worker", "learner", "ingest", "scheduler"):
        times = []
        for d in c.deaths:
            if d["kind"] != kind:
                continue
            after = [t for t in progress_at[PROGRESS_OF[kind]] if t > d["at"]]
            if after:
                times.append(after[0] - d["at"])
        recovery[kind] = ({"deaths": len(times), "median_s": round(statistics.median(times), 2),
                           "max_s": round(max(times), 2)} if times else {"deaths": 0})
    # where the scheduler's recovery goes (its log's timestamps): start-up, then the first tick
    scheduler_parts = summarize(restart_parts([d["wall"] for d in c.deaths if d["kind"] == "scheduler"],
                                              [(p.started_wall, p.log) for p in c.spawned if p.kind == "scheduler"]))
    figures = {
        "finished": finished, "seconds": round(elapsed, 1), "run": run_id, "prompts": prompts,
        "samples": len(all_samples), "workers": workers, "learners": learners, "ingests": ingests if kafka else 0,
        "scheduler": scheduler, "transport": "kafka" if kafka else "store", "random_kills": killed,
        "random_kills_by_kind": dict(Counter(d["kind"] for d in c.deaths if d["cause"] == "kill -9")),
        "fault_deaths": dict(Counter(d["cause"].split("@")[0] for d in c.deaths if d["cause"] != "kill -9")
                             + Counter({"runtime.mid_switch": len(mid_switch)})),
        "deaths": len(c.deaths) + len(mid_switch), "mid_switch": mid_switch,
        "faults_not_reached": [f for q in c.pending_faults.values() for f in q],
        "samples_skipped": len(all_samples - set(finished_by_sample)),
        "samples_duplicated": sum(1 for n in finished_by_sample.values() if n > 1),
        "abandoned_executions": len(abandoned), "abandoned_queued_for_training": len(abandoned & set(queued)),
        "progress": {str(k): v for k, v in progress.items()},
        "untrained": len(audit.skipped), "trained_twice": len(audit.duplicated), "versions": len(audit.versions),
        "version_gaps": len(audit.gaps), "bad_checkpoints": len(audit.bad_checkpoints),
        "step_mismatches": len(audit.step_mismatches), "audit_ok": audit.ok, "recovery": recovery,
        "scheduler_recovery_parts": scheduler_parts,
        "length_bias": lengths, "out": str(out),
        "checkpoints": [(v, path) for v, path, _ in history],
    }
    return _Outcome(figures, c.deaths)


def _curve(checkpoints: list[tuple[int, str]], sample_ids: list[str], points: int) -> list[tuple[int, float, float]]:
    """``(version, evaluation reward, its stderr)`` at up to ``points`` evenly spaced versions, the last included."""
    from sapwood.demo.chaos.evaluation import eval_set, evaluation_reward

    if not checkpoints:
        return []
    es = eval_set(sample_ids)
    n = len(checkpoints)
    picked = sorted({round(i * (n - 1) / max(points - 1, 1)) for i in range(min(points, n))} | {n - 1})
    out = []
    for i in picked:
        version, path = checkpoints[i]
        ev = evaluation_reward(path, es)
        out.append((version, round(ev.reward, 4), round(ev.stderr, 4)))
    return out


def run_campaign(url: str, *, prompts: int = 200, samples: int = 2, workers: int = 3, learners: int = 2,
                 kills: int = 30, seed: int = 0, lease_s: float = 2.0, call_s: float = 0.05, out: Path | None = None,
                 max_seconds: float = 1800.0, kafka: str | None = None, ingests: int = 2, scheduler: bool = True,
                 compare: bool = False, eval_points: int = 30, mid_switch_rounds: int = 2) -> dict[str, Any]:
    """Run the campaign (and with ``compare`` the no-fault run); returns the figures (module docstring)."""
    out = Path(out or tempfile.mkdtemp(prefix="sapwood-chaos-training-"))
    kw: dict[str, Any] = {"prompts": prompts, "samples": samples, "workers": workers, "learners": learners,
                          "seed": seed, "lease_s": lease_s, "call_s": call_s, "max_seconds": max_seconds,
                          "kafka": kafka, "ingests": ingests, "scheduler": scheduler}
    chaos = _run_once(url, out / "chaos" if compare else out, kills=kills, faults=True,
                      mid_switch_rounds=mid_switch_rounds, **kw)
    figures = chaos.figures
    checkpoints = figures.pop("checkpoints")
    if not compare:
        return figures
    clean = _run_once(url, out / "no-fault", kills=0, faults=False, **kw)
    clean_checkpoints = clean.figures.pop("checkpoints")
    sample_ids = [f"{i}:0:{s}" for i in range(prompts) for s in range(samples)]
    chaos_curve = _curve(checkpoints, sample_ids, eval_points)
    clean_curve = _curve(clean_checkpoints, sample_ids, eval_points)
    from sapwood.demo.chaos.plot import plot_reward_curves

    png = plot_reward_curves(out / "reward_curves.png", [(v, r) for v, r, _ in chaos_curve],
                             [(v, r) for v, r, _ in clean_curve], [(d["version"], d["kind"]) for d in chaos.deaths])
    keys = ("finished", "seconds", "samples_skipped", "samples_duplicated", "untrained", "trained_twice", "versions",
            "audit_ok")
    figures["no_fault"] = {k: clean.figures[k] for k in keys}
    if chaos_curve and clean_curve:
        (_, r1, se1), (_, r2, se2) = chaos_curve[-1], clean_curve[-1]
        noise = math.sqrt(se1 ** 2 + se2 ** 2)
        figures["reward"] = {"chaos_final": r1, "chaos_stderr": se1, "no_fault_final": r2, "no_fault_stderr": se2,
                             "difference": round(r1 - r2, 4), "within_noise": abs(r1 - r2) <= 2 * noise,
                             "chaos_curve": chaos_curve, "no_fault_curve": clean_curve, "png": str(png)}
    return figures
