"""The end-to-end demo: asynchronous single-rollout RL on the key-recall task, recorded in Sapwood.

One process, everything in threads:

1. a ``TinyActorCritic`` is briefly pre-trained on imperfect demonstrations (policy version 0,
   published to the store like every later version);
2. rollout workers (threads, :class:`~sapwood.demo.worker.RolloutWorker`) play executions
   back to back with the newest published policy, recording every call through the TITO
   recorder — in-process into the store (embedded default) or to Kafka, from where the ingest
   service (a thread here) applies them to the store;
3. a learner (the learner package's ``Learner``) claims whatever finished executions are ready
   (no group barrier), trains one CompactionRL + SAO step per batch, writes a checkpoint and
   publishes the next policy version, which the workers pick up between calls;
4. the initial and the final policy are evaluated on the same tasks; figures, plots and a
   JSON summary are written.

The workers pause while the trainer backlog (finished, untrained executions) reaches
``max_backlog``, which bounds the policy lag.
"""

from __future__ import annotations

import json
import math
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sapwood.demo.config import TASK_FAMILY, DemoConfig, DemoResult, ProgressHook
from sapwood.demo.phases import eval_tasks, evaluate, pretrained_policy
from sapwood.demo.plots import plot_lag, plot_reward
from sapwood.demo.summary import summarize
from sapwood.demo.tasks import KeyRecallEnv
from sapwood.demo.threads import IngestThread, LearnerThread, quiet_kafka
from sapwood.demo.worker import ExecutionReport, RolloutWorker
from sapwood.learner.backends import create_backend
from sapwood.learner.config import SourceConfig
from sapwood.learner.loop import Learner, latest_policy
from sapwood.learner.trainer import SAOTrainer
from sapwood.platform import runs
from sapwood.platform.events import PolicyPublished
from sapwood.platform.storage.dialects import embedded_url
from sapwood.platform.store import Store
from sapwood.rollout.recorder import Recorder
from sapwood.rollout.torch_engine import LocalTorchEngine
from sapwood.rollout.transports import InProcessTransport, KafkaTransport, Transport

__all__ = ["run_demo"]


class _Demo:
    """One demo run: its runs' ids, output directory, counters and series (read by :func:`summarize`)."""

    def __init__(self, cfg: DemoConfig, hook: ProgressHook | None) -> None:
        cfg.validate()
        self.cfg = cfg
        self.hook = hook
        self.tag = f"demo-s{cfg.seed}-{uuid.uuid4().hex[:8]}"
        self.rollout_run = self.tag
        self.train_run = f"{self.tag}-learn"
        self.eval_run = f"{self.tag}-eval"
        self.out_dir = Path(cfg.out_dir) if cfg.out_dir else Path(tempfile.mkdtemp(prefix="sapwood-demo-"))
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.database_url = cfg.database_url or embedded_url(self.out_dir / "sapwood.db")
        self.env = KeyRecallEnv(cfg.task)
        self.reports: list[ExecutionReport] = []
        self.metrics: list[dict[str, float]] = []
        self.timeline: list[dict[str, float]] = []
        self.started = 0
        self.trained = 0
        self.worker_errors = 0
        self._lock = threading.Lock()

    # -- shared counters ---------------------------------------------------------------------------
    def _gate(self) -> bool:
        with self._lock:
            if self.started >= self.cfg.executions:
                return False
            if len(self.reports) - self.trained >= self.cfg.max_backlog:
                return False
            self.started += 1
            return True

    def _on_report(self, report: ExecutionReport) -> None:
        with self._lock:
            self.reports.append(report)

    def _on_step(self, metrics: dict[str, float]) -> None:
        with self._lock:
            self.metrics.append(metrics)
            self.trained += int(metrics.get("learner/executions", 0))

    def _progress(self, phase: str, done: int, total: int, info: dict[str, Any]) -> None:
        if self.hook is not None:
            self.hook(phase, done, total, info)

    # -- pieces ------------------------------------------------------------------------------------
    def _transport(self, store: Store) -> tuple[Transport, IngestThread | None]:
        cfg = self.cfg
        if not cfg.kafka_bootstrap:
            return InProcessTransport(store, batch_size=256), None
        from sapwood.ingest.topics import ensure_topics

        topic = f"sapwood.demo.{self.tag}"
        with quiet_kafka():
            ensure_topics(cfg.kafka_bootstrap, {topic: 4})
            ingest = IngestThread(cfg, self.database_url, topic, group=f"sapwood-{self.tag}")
            ingest.start()
            transport = KafkaTransport(cfg.kafka_bootstrap, topic=topic, linger_ms=5)
        return transport, ingest

    def _publish_v0(self, store: Store, state: dict[str, torch.Tensor]) -> str:
        path = self.out_dir / "checkpoints" / "policy-v000000.pt"
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"model": state, "policy_version": 0}, path)
        store.apply([PolicyPublished(run_id=self.train_run, version=0, checkpoint=str(path),
                                     metadata={"source": "supervised pre-training", "seed": self.cfg.seed})])
        return str(path)

    def _wait_for_store(self, store: Store, run_id: str, n: int, ingest: IngestThread | None, timeout_s: float) -> None:
        """Kafka mode: wait until the ingest service has stored ``n`` finished executions of ``run_id``."""
        if ingest is None:
            return
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if store.finished_executions(run_id) >= n:
                return
            if ingest.error is not None:
                raise ingest.error
            time.sleep(0.1)
        raise TimeoutError(f"ingest stored fewer than {n} finished executions of {run_id} within {timeout_s} s")

    # -- the run -----------------------------------------------------------------------------------
    def run(self) -> DemoResult:
        cfg = self.cfg
        t_start = time.perf_counter()
        threads = torch.get_num_threads()
        torch.set_num_threads(cfg.torch_threads)
        try:
            return self._run(t_start)
        finally:
            torch.set_num_threads(threads)

    def _run(self, t_start: float) -> DemoResult:
        cfg = self.cfg
        model_cfg = cfg.model_config()
        state0, pre, cached = pretrained_policy(cfg, self._progress)
        store = Store.open(self.database_url)
        transport, ingest = self._transport(store)
        recorder = Recorder(transport, run_id=self.rollout_run, engine=LocalTorchEngine.name,
                            vocab_size=model_cfg.vocab_size, task_family=TASK_FAMILY,
                            sampling_params={"temperature": cfg.temperature, "top_p": cfg.top_p})
        eval_recorder = Recorder(transport, run_id=self.eval_run, engine=LocalTorchEngine.name,
                                 vocab_size=model_cfg.vocab_size, task_family=TASK_FAMILY)
        learner: Learner | None = None
        workers: list[RolloutWorker] = []
        learner_thread: LearnerThread | None = None
        try:
            with store.transaction() as conn:
                runs.create_run(conn, self.train_run, runs.ExecutionFilter(run_id=self.rollout_run), kind="live",
                                seed=cfg.seed, description="sapwood demo: asynchronous single-rollout training")
            self._publish_v0(store, state0)
            tasks = eval_tasks(cfg)

            # -- evaluation of policy version 0 --
            t_eval = time.perf_counter()
            engine0 = LocalTorchEngine(model_cfg, state=state0, policy_version=0, seed=cfg.seed)
            eval_start = evaluate(cfg, engine0, eval_recorder, tasks, "eval-start", self._progress)
            eval_s = time.perf_counter() - t_eval

            # -- asynchronous phase: workers + learner --
            torch.manual_seed(cfg.seed + 1)
            lcfg = cfg.learner_config()
            backend = create_backend(cfg.backend, model_cfg, lcfg, init_state=state0)
            learner = Learner(store, self.train_run, SAOTrainer(backend, lcfg), learner_id=f"{self.tag}-learner-0",
                              checkpoint_dir=self.out_dir / "checkpoints",
                              source_config=SourceConfig(jmax=cfg.jmax, executions_per_batch=cfg.executions_per_batch,
                                                         train_summaries=cfg.train_summaries, seed=cfg.seed))
            learner_thread = LearnerThread(learner, self._on_step)

            def latest() -> tuple[int, str] | None:
                return latest_policy(store, self.train_run)

            for i in range(cfg.workers):
                engine = LocalTorchEngine(model_cfg, state=state0, policy_version=0, latest=latest,
                                          refresh_interval_s=0.05, seed=cfg.seed * 1000 + i)
                frozen = None if cfg.train_summaries else LocalTorchEngine(model_cfg, state=state0, policy_version=0,
                                                                           seed=cfg.seed * 1000 + 500 + i)
                workers.append(RolloutWorker(i, self.env, engine, recorder, seed=cfg.seed * 1000 + 17 * i + 1,
                                             temperature=cfg.temperature, top_p=cfg.top_p, gate=self._gate,
                                             on_report=self._on_report, keep_calls=cfg.keep_calls,
                                             summary_engine=frozen))
            t_rl = time.perf_counter()
            learner_thread.start()
            for w in workers:
                w.start()
            timed_out = self._supervise(t_rl, workers, learner_thread, ingest, store)
            for w in workers:
                w.stop()
            for w in workers:
                w.join()
            recorder.flush()
            if not timed_out:
                self._wait_for_store(store, self.rollout_run, len(self.reports), ingest, 60)
                self._drain(learner_thread, store, t_rl)
            learner_thread.stop()
            learner_thread.join()
            if learner_thread.error is not None:
                raise learner_thread.error
            rl_s = time.perf_counter() - t_rl
            self._prune_checkpoints()

            # -- evaluation of the final policy --
            final_state = {k: v.detach().clone() for k, v in backend.state_dict()["model"].items()}
            engine1 = LocalTorchEngine(model_cfg, state=final_state, policy_version=backend.policy_version,
                                       seed=cfg.seed)
            engine1_summary = None if cfg.train_summaries else LocalTorchEngine(model_cfg, state=state0,
                                                                               policy_version=0, seed=cfg.seed + 1)
            eval_end = evaluate(cfg, engine1, eval_recorder, tasks, "eval-end", self._progress,
                                summary_engine=engine1_summary)
            eval_recorder.flush()
            self._wait_for_store(store, self.eval_run, 2 * len(tasks), ingest, 60)
            stats = store.stats()
            summary = summarize(self, stats, eval_start, eval_end, pre, cached, rl_s, eval_s,
                                    time.perf_counter() - t_start, timed_out, backend.policy_version)
        finally:
            for w in workers:
                w.stop()
            if learner_thread is not None and learner_thread.is_alive():
                learner_thread.stop()
                learner_thread.join(timeout=30)
            if learner is not None:
                learner.close()
            try:
                recorder.close(timeout=30)
            finally:
                if ingest is not None:
                    ingest.stop()
                store.close()
        if cfg.plots:
            summary["plots"] = [str(p) for p in self._plots(summary)]
        (self.out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        with (self.out_dir / "learner_metrics.jsonl").open("w") as f:
            for m in self.metrics:
                f.write(json.dumps(m) + "\n")
        return DemoResult(summary=summary, reports=list(self.reports), learner_metrics=list(self.metrics),
                          timeline=list(self.timeline), eval_start=eval_start, eval_end=eval_end,
                          database_url=self.database_url, rollout_run=self.rollout_run, train_run=self.train_run,
                          out_dir=self.out_dir)

    def _sample(self, t_rl: float, ingest: IngestThread | None) -> dict[str, float]:
        with self._lock:
            finished = len(self.reports)
            last = self.metrics[-1] if self.metrics else {}
            rewards = [r.reward for r in self.reports[-32:]]
            row = {
                "t": time.perf_counter() - t_rl,
                "started": float(self.started),
                "finished": float(finished),
                "trained": float(self.trained),
                "backlog": float(finished - self.trained),
                "in_flight": float(self.started - finished - self.worker_errors),
                "ingest_lag": float(ingest.lag) if ingest is not None else 0.0,
                "policy_version": float(last.get("policy/version", 0.0)),
                "staleness_mean": float(last.get("policy/staleness_mean", 0.0)),
                "staleness_max": float(last.get("policy/staleness_max", 0.0)),
                "reward_recent": float(np.mean(rewards)) if rewards else float("nan"),
            }
        self.timeline.append(row)
        return row

    def _supervise(self, t_rl: float, workers: list[RolloutWorker], learner_thread: LearnerThread,
                   ingest: IngestThread | None, store: Store) -> bool:
        """Sample lags and report progress until every rollout is played; True if the time cap hit."""
        cfg = self.cfg
        while True:
            row = self._sample(t_rl, ingest)
            self.worker_errors = sum(len(w.errors) for w in workers)
            self._progress("rollout", int(row["finished"]), cfg.executions, row)
            if learner_thread.error is not None:
                raise learner_thread.error
            if ingest is not None and ingest.error is not None:
                raise ingest.error
            if all(not w.is_alive() for w in workers):
                errors = [e for w in workers for e in w.errors]
                raise RuntimeError(f"every rollout worker stopped; first error: {errors[0] if errors else None!r}")
            self._prune_checkpoints()
            if row["started"] >= cfg.executions and row["in_flight"] <= 0:
                return False
            if row["t"] > cfg.max_seconds:
                return True
            time.sleep(0.25)

    def _prune_checkpoints(self) -> None:
        """Delete all but the newest ``keep_checkpoints`` checkpoints (version 0 stays)."""
        found = sorted((self.out_dir / "checkpoints").glob("policy-v*.pt"))
        for path in found[1 : max(1, len(found) - self.cfg.keep_checkpoints)]:
            if path.name != "policy-v000000.pt":
                path.unlink(missing_ok=True)

    def _drain(self, learner_thread: LearnerThread, store: Store, t_rl: float) -> None:
        """Let the learner train what is left of the backlog (bounded by ``max_backlog``)."""
        deadline = time.perf_counter() + 60
        while time.perf_counter() < deadline and learner_thread.is_alive():
            with store.transaction() as conn:
                runs.sync_run(conn, self.train_run)
                progress = runs.run_progress(conn, self.train_run)
            row = self._sample(t_rl, None)
            self._progress("rollout", int(row["finished"]), self.cfg.executions, row)
            if progress["pending"] == 0 and progress["claimed"] == 0:
                return
            time.sleep(0.1)

    def _plots(self, summary: dict[str, Any]) -> list[Path]:
        label = (f"seed {self.cfg.seed}, loss {self.cfg.aggregation}, "
                 f"summarizer {'trained' if self.cfg.train_summaries else 'frozen'}")
        reward = plot_reward(
            self.out_dir / "reward.png",
            [m.get("policy/version", float(i)) for i, m in enumerate(self.metrics)],
            [m.get("learner/rewards_mean", math.nan) for m in self.metrics],
            rollout_rewards=[r.reward for r in self.reports],
            eval_start=summary["reward_start"], eval_end=summary["reward_end"],
            title=f"Reward vs learner step ({label})",
        )
        lag = plot_lag(self.out_dir / "lag.png", self.timeline, title=f"Backlog, ingest lag and staleness ({label})")
        return [reward, lag]


def run_demo(cfg: DemoConfig | None = None, *, hook: ProgressHook | None = None) -> DemoResult:
    """Run the demo once (see the module docstring)."""
    return _Demo(cfg or DemoConfig(), hook).run()
