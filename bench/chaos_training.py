"""Training chaos campaign: kill -9 rollout workers and learners of a real run, then prove from the store
that every prompt sample was rolled out once and every finished execution trained exactly once.

    python bench/chaos_training.py --database-url postgresql+psycopg://postgres@127.0.0.1:5432/postgres \\
        [--prompts 200] [--samples 2] [--workers 3] [--learners 2] [--kills 30] [--out DIR] \\
        [--kafka BOOTSTRAP --ingests 2]

(default URL: ``SAPWOOD_TEST_DATABASE_URL``). A fresh run gets ``--prompts`` synthetic prompts ×
``--samples`` samples (``sapwood.platform.prompts``); ``--workers`` rollout worker processes
(``python -m sapwood.rollout.prompt_worker``) claim and record them straight into the store, and
``--learners`` ``sapwood learn`` processes train the run's finished executions concurrently (each commit
races the others for the next version; the loser rolls back and reloads). With ``--kafka``, the workers
record through Kafka (a fresh 4-partition topic) and ``--ingests`` ``sapwood ingest`` processes apply the
events; a worker keeps each sample's lease until ingest stored its finished execution. While they run,
the supervisor SIGKILLs a random process (past its start-up, not armed with a fault point) at random times
(``--kills``) and restarts every process that dies; each fault point of the learner, the worker and (with
Kafka) ingest (``SAPWOOD_FAULT``) is armed on two (re)starts, so those processes kill themselves there.

Afterwards, from the store alone: every sample has exactly one finished attempt (abandoned attempts are
re-issued, kept, never queued for training); the rollout lengths (model calls) of re-issued samples' finished
executions against the others' (KS distance, permutation p-value: ``sapwood.learner.length_bias``); and the
exactly-once audit of the training run
(:func:`sapwood.learner.audit.audit_training`): 0 skipped, 0 duplicated, contiguous versions, every
published checkpoint loads with its digest, trainer step counts consistent. Recovery per kill: seconds from
the death until that kind of process makes progress again (a sample done / a version published).

Not covered here: the live scheduler and the elastic runtime, and the reward comparison with a no-fault run.
(Ingest's own kill -9 campaign, with zombies and backend terminations, is ``bench/chaos.py``.) Each
attempt's length is drawn afresh (``prompt_worker.attempt_length``), so the length check detects a queue
that favours short rollouts on re-issue, not the (expected) fact that long attempts are killed more often.
The last stdout line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
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

from sapwood.learner.audit import audit_training
from sapwood.learner.length_bias import length_bias
from sapwood.platform import runs
from sapwood.platform.prompts import PromptRow, add_prompts, prompt_progress
from sapwood.platform.storage.backends import prompt_queue
from sapwood.platform.storage.learner_reads import policy_history, run_item_states
from sapwood.platform.store import Store

LEARNER_POINTS = ("learner.after_step", "learner.after_checkpoint", "learner.in_commit")
WORKER_POINTS = ("rollout.after_claim", "rollout.mid_recording")
INGEST_POINTS = ("ingest.after_apply",)
#: Seconds a process runs before it may be picked for a random kill.
STARTUP_S = {"worker": 1.0, "learner": 6.0, "ingest": 3.0}
#: Whose progress shows a kind of process recovered: ingest's is the samples it lets finish.
PROGRESS_OF = {"worker": "worker", "learner": "learner", "ingest": "worker"}


@dataclass
class Proc:
    kind: str  # "worker" | "learner" | "ingest"
    slot: int
    popen: subprocess.Popen[bytes]
    fault: str | None
    started: float


@dataclass
class Campaign:
    url: str
    run_id: str
    out: Path
    workers: int
    learners: int
    lease_s: float
    call_s: float
    rng: random.Random
    kafka: tuple[str, str] | None = None
    """(bootstrap, topic) when the workers record through Kafka and ingest processes apply the events."""
    procs: list[Proc] = field(default_factory=list)
    generation: Counter[str] = field(default_factory=Counter)
    deaths: list[dict[str, Any]] = field(default_factory=list)
    pending_faults: dict[str, list[str]] = field(default_factory=dict)

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
        if kind == "worker":
            cmd = [sys.executable, "-m", "sapwood.rollout.prompt_worker", self.url, self.run_id, name,
                   str(self.lease_s), "4", "3", str(self.call_s), *(self.kafka or ())]
        elif kind == "ingest":
            assert self.kafka is not None
            bootstrap, topic = self.kafka
            cmd = [sys.executable, "-m", "sapwood.ingest", "--database-url", self.url, "--bootstrap", bootstrap,
                   "--topic", topic, "--group", f"{topic}-ingest", "--batch-size", "50", "--partitions", "0",
                   "--dead-letter-topic", f"{topic}.dlq"]
        else:
            cmd = [sys.executable, "-c", "from sapwood.platform.cli import main; main()", "learn",
                   "--database-url", self.url, "--run", self.run_id, "--executions-per-batch", "4",
                   "--critic-warmup-steps", "0", "--lease-s", str(self.lease_s), "--checkpoint-dir",
                   str(self.out / "checkpoints"), "--checkpoint-grace-s", "60", "--idle-timeout", "10",
                   "--max-steps", "100000", "--threads", "1", "--vocab-size", "500"]
        log = open(self.out / f"{name}.log", "wb")  # noqa: SIM115 (the child owns it)
        p = Proc(kind, slot, subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT), fault,
                 time.monotonic())
        self.procs.append(p)
        return p


def _progress(store: Store, run_id: str) -> tuple[int, int, int, int]:
    """(samples done, samples total, published versions, run items not done)."""
    with store.transaction() as conn:
        prog = prompt_progress(conn, run_id)
        runs.sync_run(conn, run_id)
        items = run_item_states(conn, run_id)
        versions = len(policy_history(conn, run_id))
    done = sum(e["done"] for e in prog.values())
    total = sum(e["pending"] + e["claimed"] + e["done"] for e in prog.values())
    return done, total, versions, sum(1 for s in items.values() if s != "done")


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


def run_campaign(url: str, *, prompts: int = 200, samples: int = 2, workers: int = 3, learners: int = 2,
                 kills: int = 30, seed: int = 0, lease_s: float = 2.0, call_s: float = 0.05, out: Path | None = None,
                 max_seconds: float = 1800.0, kafka: str | None = None, ingests: int = 2) -> dict[str, Any]:
    """Run the campaign; returns the figures (see the module docstring)."""
    out = Path(out or tempfile.mkdtemp(prefix="sapwood-chaos-training-"))
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    run_id = f"chaos-{uuid.uuid4().hex[:8]}"
    store = Store.open(url)
    with store.transaction() as conn:
        runs.create_run(conn, run_id, runs.ExecutionFilter(run_id=run_id), kind="live", seed=seed)
        add_prompts(conn, run_id, [PromptRow(f"prompt {i}", f"task-{i}", "chaos", {"i": i}) for i in range(prompts)],
                    samples_per_prompt=samples)
    c = Campaign(url, run_id, out, workers, learners, lease_s, call_s, rng,
                 (kafka, kafka_topic(kafka)) if kafka else None)
    c.pending_faults = {"learner": [f"{p}@{rng.randint(1, 2)}" for _ in range(2) for p in LEARNER_POINTS],
                        "worker": [f"{p}@{rng.randint(1, 3)}" for _ in range(2) for p in WORKER_POINTS]}
    if kafka:
        c.pending_faults["ingest"] = [f"{p}@{rng.randint(1, 3)}" for _ in range(2) for p in INGEST_POINTS]
    t0 = time.monotonic()
    for i in range(ingests if kafka else 0):
        c.spawn("ingest", i)
    for i in range(workers):
        c.spawn("worker", i)
    for i in range(learners):
        c.spawn("learner", i)
    progress_at: dict[str, list[float]] = {"worker": [], "learner": []}
    last = (0, 0)
    killed = 0
    next_kill = time.monotonic() + rng.uniform(1.0, 4.0)
    finished = False
    while time.monotonic() - t0 < max_seconds:
        done, total, versions, untrained = _progress(store, run_id)
        now = time.monotonic()
        if done > last[0]:
            progress_at["worker"].append(now)
        if versions > last[1]:
            progress_at["learner"].append(now)
        last = (done, versions)
        if done == total and untrained == 0:
            finished = True
            break
        for p in list(c.procs):
            rc = p.popen.poll()
            if rc is None:
                continue
            c.procs.remove(p)
            if rc == -9:
                c.deaths.append({"kind": p.kind, "at": now, "cause": p.fault or "kill -9"})
            elif rc != 0:
                raise RuntimeError(f"{p.kind} {p.slot} exited {rc}; see {out}")
            c.spawn(p.kind, p.slot)
        # victims: processes past their start-up (a learner imports torch first) and not armed with a fault
        # point (those kill themselves there)
        eligible = [p for p in c.procs if p.fault is None and now - p.started > STARTUP_S[p.kind]]
        if killed < kills and now >= next_kill and eligible:
            victim = rng.choice(eligible)
            victim.popen.kill()
            victim.popen.wait()
            c.procs.remove(victim)
            c.deaths.append({"kind": victim.kind, "at": time.monotonic(), "cause": "kill -9"})
            killed += 1
            c.spawn(victim.kind, victim.slot)
            next_kill = time.monotonic() + rng.uniform(0.3, 1.5)
        time.sleep(0.2)
    for p in c.procs:
        p.popen.kill()
        p.popen.wait()
    elapsed = time.monotonic() - t0

    # -- the proof, from the store alone --------------------------------------------------------------
    with store.transaction() as conn:
        attempts = prompt_queue(conn).attempts(conn, run_id)
        progress = prompt_progress(conn, run_id)
        queued = run_item_states(conn, run_id)
        lengths = length_bias(conn, attempts, seed=seed)
    finished_by_sample = Counter(a["sample_id"] for a in attempts if a["state"] == "finished")
    all_samples = {f"{i}:0:{s}" for i in range(prompts) for s in range(samples)}
    abandoned = {a["execution_id"] for a in attempts if a["state"] == "abandoned"}
    audit = audit_training(store, run_id)
    recovery: dict[str, dict[str, float | int]] = {}
    for kind in ("worker", "learner", "ingest"):
        times = []
        for d in c.deaths:
            if d["kind"] != kind:
                continue
            after = [t for t in progress_at[PROGRESS_OF[kind]] if t > d["at"]]
            if after:
                times.append(after[0] - d["at"])
        recovery[kind] = ({"deaths": len(times), "median_s": round(statistics.median(times), 2),
                           "max_s": round(max(times), 2)} if times else {"deaths": 0})
    return {
        "finished": finished, "seconds": round(elapsed, 1), "prompts": prompts, "samples": len(all_samples),
        "workers": workers, "learners": learners, "ingests": ingests if kafka else 0,
        "transport": "kafka" if kafka else "store", "random_kills": killed,
        "random_kills_by_kind": dict(Counter(d["kind"] for d in c.deaths if d["cause"] == "kill -9")),
        "fault_deaths": dict(Counter(d["cause"].split("@")[0] for d in c.deaths if d["cause"] != "kill -9")),
        "deaths": len(c.deaths), "faults_not_reached": [f for q in c.pending_faults.values() for f in q],
        "samples_skipped": len(all_samples - set(finished_by_sample)),
        "samples_duplicated": sum(1 for n in finished_by_sample.values() if n > 1),
        "abandoned_executions": len(abandoned), "abandoned_queued_for_training": len(abandoned & set(queued)),
        "progress": {str(k): v for k, v in progress.items()},
        "untrained": len(audit.skipped), "trained_twice": len(audit.duplicated), "versions": len(audit.versions),
        "version_gaps": len(audit.gaps), "bad_checkpoints": len(audit.bad_checkpoints),
        "step_mismatches": len(audit.step_mismatches), "audit_ok": audit.ok, "recovery": recovery,
        "length_bias": lengths,
        "out": str(out),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--database-url", default=os.environ.get("SAPWOOD_TEST_DATABASE_URL"))
    ap.add_argument("--prompts", type=int, default=200)
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--learners", type=int, default=2)
    ap.add_argument("--kills", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lease-s", type=float, default=2.0)
    ap.add_argument("--call-s", type=float, default=0.05, help="simulated generation time per model call")
    ap.add_argument("--max-seconds", type=float, default=1800.0)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--kafka", default=None, metavar="BOOTSTRAP", help="record through Kafka, applied by ingest")
    ap.add_argument("--ingests", type=int, default=2, help="ingest processes (with --kafka)")
    a = ap.parse_args(argv)
    if not a.database_url:
        ap.error("pass --database-url (or set SAPWOOD_TEST_DATABASE_URL)")
    figures = run_campaign(a.database_url, prompts=a.prompts, samples=a.samples, workers=a.workers,
                           learners=a.learners, kills=a.kills, seed=a.seed, lease_s=a.lease_s, call_s=a.call_s,
                           out=a.out, max_seconds=a.max_seconds, kafka=a.kafka, ingests=a.ingests)
    print(json.dumps(figures))
    return figures


if __name__ == "__main__":
    main()
