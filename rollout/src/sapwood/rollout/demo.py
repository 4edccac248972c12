"""The end-to-end demo: asynchronous single-rollout RL on the key-recall task, recorded in Sapwood.

One process, everything in threads:

1. a ``TinyActorCritic`` is briefly pre-trained on imperfect demonstrations (policy version 0,
   published to the store like every later version);
2. rollout workers (threads, :class:`~sapwood.rollout.worker.RolloutWorker`) play executions
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

import hashlib
import json
import math
import tempfile
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
import sqlalchemy as sa
import torch

from sapwood.learner.backends import BACKENDS, create_backend
from sapwood.learner.config import AdvantageConfig, CriticConfig, LearnerConfig, OptimConfig, PolicyLossConfig
from sapwood.learner.loop import Learner, latest_policy
from sapwood.learner.model import TinyActorCritic, TinyTransformerConfig
from sapwood.learner.source import SourceConfig
from sapwood.learner.trainer import SAOTrainer
from sapwood.platform import runs
from sapwood.platform import schema as t
from sapwood.platform.errors import ValidationError
from sapwood.platform.events import PolicyPublished
from sapwood.platform.store import Store
from sapwood.rollout.engines import LocalTorchEngine
from sapwood.rollout.plots import plot_lag, plot_reward
from sapwood.rollout.pretrain import PretrainConfig, PretrainResult, pretrain
from sapwood.rollout.recorder import Recorder
from sapwood.rollout.tasks import KeyRecallConfig, KeyRecallEnv, KeyTask
from sapwood.rollout.transports import InProcessTransport, KafkaTransport, Transport
from sapwood.rollout.worker import ExecutionReport, RolloutWorker, run_execution

__all__ = ["DemoConfig", "DemoResult", "ProgressHook", "run_demo"]

TASK_FAMILY = "key-recall"


@dataclass(frozen=True)
class DemoConfig:
    """Everything a demo run depends on (the seed fixes tasks, pre-training and initial weights)."""

    seed: int = 0
    """Seeds tasks, demonstrations, weights and sampling."""
    workers: int = 2
    """Rollout worker threads."""
    executions: int = 640
    """Training rollouts (executions) to play."""
    max_seconds: float = 200.0
    """Wall-clock cap of the asynchronous phase (rollouts + training)."""
    eval_executions: int = 128
    """Executions of the start and end evaluations (same tasks for both)."""
    max_backlog: int = 16
    """Workers pause while this many finished executions wait for training."""
    executions_per_batch: int = 8
    """Most executions a learner claims per step (it takes what is ready, no barrier)."""
    jmax: int = 8
    """At most this many trajectories of one execution per batch."""
    temperature: float = 1.0
    """Sampling temperature of the rollouts (1: the logged π_rollout is the model's distribution)."""
    top_p: float = 1.0
    """Nucleus sampling mass of the rollouts."""
    aggregation: Literal["token", "segment_mean"] = "token"
    """Loss aggregation: token-level (|M|) or the per-segment-mean ablation."""
    fork_weighting: Literal["path", "unit"] = "path"
    """Token weights: path probabilities (an execution weighs one trajectory) or the unit-weight ablation."""
    train_summaries: bool = True
    """False freezes the summarizer: summary calls are served by the pre-trained policy (version 0)
    and their tokens are not trained, while actions use the newest policy (the sources' "swap only
    the summarizer" ablation; zeroing the summary loss alone would still move the summarizer,
    which shares its weights with the actor)."""
    actor_lr: float = 1e-3
    """Actor learning rate (the learner's default 1e-4 suits bigger models; this one is tiny)."""
    critic_lr: float = 1e-3
    """Critic learning rate."""
    critic_warmup_steps: int = 4
    """Critic-only steps before the first policy update (SAO's critic warm-up)."""
    lam: float | None = None
    """GAE lambda (cross-trajectory GAE discounts earlier segments by ``lam ** tokens after them``);
    None: the learner's horizon-aware default ``1 - 1/horizon_tokens``."""
    task: KeyRecallConfig = field(default_factory=KeyRecallConfig)
    """The task family."""
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)
    """Supervised warm start (policy version 0)."""
    d_model: int = 64
    """Width of the ``TinyActorCritic``."""
    n_heads: int = 4
    """Attention heads."""
    n_layers: int = 2
    """Transformer blocks per trunk (actor and critic)."""
    d_ff: int = 128
    """MLP width."""
    database_url: str | None = None
    """Store URL; None: a SQLite file in ``out_dir``."""
    kafka_bootstrap: str | None = None
    """Kafka ``host:port``: record through Kafka and run the ingest service (a thread)."""
    out_dir: Path | None = None
    """Plots, checkpoints and summary; None: a new temporary directory."""
    torch_threads: int = 1
    """torch intra-op threads (tiny tensors: more threads only add contention)."""
    keep_checkpoints: int = 4
    """Checkpoints kept besides version 0 (older ones are deleted as training goes; the
    ``policy_published`` events keep their paths for the audit trail)."""
    keep_calls: bool = False
    """Keep every call's exact input/output in the reports (tests compare them with the store)."""
    plots: bool = True
    """Write ``reward.png`` and ``lag.png``."""
    backend: str = "torch"
    """Learner backend: ``"torch"`` (``TorchBackend``) or ``"megatron"`` (megatron-core ``GPTModel``, same
    weights through the weight mapping; its checkpoints keep the ``TinyActorCritic`` layout the workers load)."""

    def model_config(self) -> TinyTransformerConfig:
        return TinyTransformerConfig(vocab_size=self.task.vocab_size, d_model=self.d_model, n_heads=self.n_heads,
                                     n_layers=self.n_layers, d_ff=self.d_ff, max_position=self.task.context_limit)

    def learner_config(self) -> LearnerConfig:
        return LearnerConfig(
            advantage=AdvantageConfig(lam=self.lam),
            policy=PolicyLossConfig(aggregation=self.aggregation, fork_weighting=self.fork_weighting),
            critic=CriticConfig(warmup_steps=self.critic_warmup_steps),
            optim=OptimConfig(actor_lr=self.actor_lr, critic_lr=self.critic_lr),
            jmax=self.jmax,
        )

    def validate(self) -> None:
        if self.workers < 1 or self.executions < 1 or self.eval_executions < 0:
            raise ValidationError("workers and executions must be ≥ 1, eval_executions ≥ 0")
        if self.keep_checkpoints < 1:
            raise ValidationError("keep_checkpoints must be ≥ 1 (workers load the newest)")
        if self.max_backlog < 1 or self.executions_per_batch < 1:
            raise ValidationError("max_backlog and executions_per_batch must be ≥ 1")
        if self.aggregation not in ("token", "segment_mean"):
            raise ValidationError(f"aggregation must be 'token' or 'segment_mean', got {self.aggregation!r}")
        if self.backend not in BACKENDS:
            raise ValidationError(f"backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        if self.fork_weighting not in ("path", "unit"):
            raise ValidationError(f"fork_weighting must be 'path' or 'unit', got {self.fork_weighting!r}")
        if self.kafka_bootstrap and not self.database_url:
            raise ValidationError("the Kafka demo needs --database-url (the store the ingest service writes)")


@dataclass
class DemoResult:
    """Figures of a run (``summary`` is the JSON line) and the raw series behind them."""

    summary: dict[str, Any]
    reports: list[ExecutionReport]
    learner_metrics: list[dict[str, float]]
    timeline: list[dict[str, float]]
    eval_start: list[ExecutionReport]
    eval_end: list[ExecutionReport]
    database_url: str
    rollout_run: str
    train_run: str
    out_dir: Path


#: ``hook(phase, done, total, info)``: progress of "pretrain", "eval-start", "rollout", "eval-end".
ProgressHook = Callable[[str, int, int, dict[str, Any]], None]

_PRETRAINED: dict[str, tuple[dict[str, torch.Tensor], PretrainResult]] = {}
_PRETRAINED_LOCK = threading.Lock()


def _pretrain_key(cfg: DemoConfig) -> str:
    blob = json.dumps([asdict(cfg.model_config()), asdict(cfg.task), asdict(cfg.pretrain), cfg.seed],
                      sort_keys=True, default=str)
    return hashlib.blake2b(blob.encode(), digest_size=12).hexdigest()


def pretrained_policy(cfg: DemoConfig, hook: ProgressHook | None = None) -> tuple[dict[str, torch.Tensor],
                                                                                 PretrainResult, bool]:
    """Policy version 0: a ``TinyActorCritic`` state after brief supervised pre-training.

    Cached per process by configuration and seed (ablation arms share it). Returns
    ``(state_dict, result, cached)``.
    """
    key = _pretrain_key(cfg)
    with _PRETRAINED_LOCK:
        if key in _PRETRAINED:
            state, result = _PRETRAINED[key]
            return {k: v.clone() for k, v in state.items()}, result, True
        torch.manual_seed(cfg.seed)
        model = TinyActorCritic(cfg.model_config())
        def on_step(step: int, loss: float, planned: int) -> None:
            if hook is not None:
                hook("pretrain", step + 1, planned, {"loss": loss})

        result = pretrain(model, KeyRecallEnv(cfg.task), replace(cfg.pretrain, seed=cfg.seed), on_step=on_step)
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        _PRETRAINED[key] = (state, result)
        return {k: v.clone() for k, v in state.items()}, result, False


def eval_tasks(cfg: DemoConfig) -> list[KeyTask]:
    """The fixed evaluation tasks of a seed."""
    env = KeyRecallEnv(cfg.task)
    rng = np.random.default_rng([cfg.seed, 7919])
    return [env.sample_task(rng, task_id=f"eval-{i}") for i in range(cfg.eval_executions)]


def evaluate(cfg: DemoConfig, engine: LocalTorchEngine, recorder: Recorder, tasks: list[KeyTask], phase: str,
             hook: ProgressHook | None = None, summary_engine: LocalTorchEngine | None = None,
             ) -> list[ExecutionReport]:
    """Play ``tasks`` once each with a fixed engine (same sampling seeds at start and end)."""
    env = KeyRecallEnv(cfg.task)
    out = []
    for i, task in enumerate(tasks):
        rng = np.random.default_rng([cfg.seed, 104729, i])
        engine.generator.manual_seed(cfg.seed * 1_000_003 + i)
        if summary_engine is not None:
            summary_engine.generator.manual_seed(cfg.seed * 1_000_033 + i)
        out.append(run_execution(env, engine, recorder, task, rng, temperature=cfg.temperature, top_p=cfg.top_p,
                                 fork=False, run_metadata={"phase": phase}, summary_engine=summary_engine))
        if hook is not None:
            hook(phase, i + 1, len(tasks), {"reward": float(np.mean([r.reward for r in out]))})
    return out


class _LearnerThread(threading.Thread):
    def __init__(self, learner: Learner, on_step: Callable[[dict[str, float]], None]) -> None:
        super().__init__(name="learner", daemon=True)
        self.learner = learner
        self.on_step = on_step
        self.error: BaseException | None = None
        self._stop_event = threading.Event()

    def stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        try:
            while not self._stop_event.is_set():
                metrics = self.learner.step(timeout_s=0.25)
                if metrics is not None:
                    metrics["learner/time"] = time.time()
                    self.on_step(metrics)
        except BaseException as exc:  # surfaced by the demo's main loop
            self.error = exc


class _Ingest:
    """The Kafka → store ingest service in a thread (Kafka mode only)."""

    def __init__(self, cfg: DemoConfig, database_url: str, topic: str, group: str) -> None:
        from sapwood.ingest.service import IngestConfig, IngestService

        assert cfg.kafka_bootstrap
        self.service = IngestService(IngestConfig(
            database_url=database_url, bootstrap=cfg.kafka_bootstrap, topic=topic, group=group,
            dead_letter_topic=None, partitions=4, lag_interval_s=0.5, poll_timeout_ms=100,
        ))
        self.thread = threading.Thread(target=self._run, name="ingest", daemon=True)
        self.error: BaseException | None = None

    def _run(self) -> None:
        try:
            self.service.run()
        except BaseException as exc:
            self.error = exc

    def start(self) -> None:
        self.thread.start()

    @property
    def lag(self) -> int:
        return int(sum(self.service.lag.values()))

    def stop(self) -> None:
        self.service.stop()
        self.thread.join(timeout=30)


@contextmanager
def _quiet_kafka() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        yield


class _Demo:
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
        self.database_url = cfg.database_url or f"sqlite:///{self.out_dir / 'sapwood.db'}"
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
    def _transport(self, store: Store) -> tuple[Transport, _Ingest | None]:
        cfg = self.cfg
        if not cfg.kafka_bootstrap:
            return InProcessTransport(store, batch_size=256), None
        from sapwood.ingest.topics import ensure_topics

        topic = f"sapwood.demo.{self.tag}"
        with _quiet_kafka():
            ensure_topics(cfg.kafka_bootstrap, {topic: 4})
            ingest = _Ingest(cfg, self.database_url, topic, group=f"sapwood-{self.tag}")
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

    def _wait_for_store(self, store: Store, run_id: str, n: int, ingest: _Ingest | None, timeout_s: float) -> None:
        """Kafka mode: wait until the ingest service has stored ``n`` finished executions of ``run_id``."""
        if ingest is None:
            return
        c = t.executions.c
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with store.transaction() as conn:
                got = conn.execute(sa.select(sa.func.count()).where(
                    c.run_id == run_id, c.status.in_(runs.FINISHED))).scalar_one()
            if got >= n:
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
        learner_thread: _LearnerThread | None = None
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
            learner_thread = _LearnerThread(learner, self._on_step)

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
            summary = self._summary(stats, eval_start, eval_end, pre, cached, rl_s, eval_s,
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

    def _sample(self, t_rl: float, ingest: _Ingest | None) -> dict[str, float]:
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

    def _supervise(self, t_rl: float, workers: list[RolloutWorker], learner_thread: _LearnerThread,
                   ingest: _Ingest | None, store: Store) -> bool:
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

    def _drain(self, learner_thread: _LearnerThread, store: Store, t_rl: float) -> None:
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

    # -- figures -----------------------------------------------------------------------------------
    def _summary(self, stats: dict[str, Any], eval_start: list[ExecutionReport], eval_end: list[ExecutionReport],
                 pre: PretrainResult, cached: bool, rl_s: float, eval_s: float, total_s: float, timed_out: bool,
                 version: int) -> dict[str, Any]:
        cfg = self.cfg
        reps = self.reports
        window = max(1, min(100, len(reps) // 4))
        timeouts = [r for r in reps if r.status == "timeout"]
        tok = np.array([m.get("train/trainable_tokens", 0.0) for m in self.metrics])
        st_mean = np.array([m.get("policy/staleness_mean", 0.0) for m in self.metrics])
        st_max = [m.get("policy/staleness_max", 0.0) for m in self.metrics]
        masked = np.array([m.get("policy/masked_frac", 0.0) for m in self.metrics])
        versions_behind = float((tok * st_mean).sum() / tok.sum()) if tok.sum() > 0 else 0.0

        def mean(xs: list[float]) -> float:
            return round(float(np.mean(xs)), 4) if xs else float("nan")

        seg_start = [1.0 + r.compactions / max(1, len(r.leaf_scores)) for r in eval_start]

        return {
            "seed": cfg.seed,
            "store": "postgresql" if self.database_url.startswith("postgresql") else "sqlite",
            "transport": "kafka" if cfg.kafka_bootstrap else "in-process",
            "aggregation": cfg.aggregation,
            "backend": cfg.backend,
            "fork_weighting": cfg.fork_weighting,
            "train_summaries": cfg.train_summaries,
            "reward_start": mean([r.reward for r in eval_start]),
            "reward_end": mean([r.reward for r in eval_end]),
            "eval_executions": len(eval_start),
            "rollout_reward_first": mean([r.reward for r in reps[:window]]),
            "rollout_reward_last": mean([r.reward for r in reps[-window:]]),
            "rollout_window": window,
            "summary_recall_start": mean([x for r in eval_start for x in r.summary_recall]),
            "summary_recall_end": mean([x for r in eval_end for x in r.summary_recall]),
            "invalid_actions_start": mean([float(r.invalid_actions) for r in eval_start]),
            "invalid_actions_end": mean([float(r.invalid_actions) for r in eval_end]),
            "executions": len(reps),
            "trajectories": sum(len(r.leaf_scores) for r in reps),
            "generated_tokens": sum(r.generated_tokens for r in reps),
            "calls": sum(r.calls for r in reps),
            "compactions": sum(r.compactions for r in reps),
            "forks": sum(r.forks for r in reps),
            "eval_forks_start": mean([float(r.forks) for r in eval_start]),
            "eval_forks_end": mean([float(r.forks) for r in eval_end]),
            "rollout_forks_first": mean([float(r.forks) for r in reps[:window]]),
            "rollout_forks_last": mean([float(r.forks) for r in reps[-window:]]),
            # Segments per trajectory of the start evaluation (compactions spread over its trajectories).
            "eval_segments_mean": mean(seg_start),
            "eval_segments_max": max(seg_start, default=0.0),
            "timeouts": len(timeouts),
            "timeout_partial_score_mean": mean([r.partial_score for r in timeouts if r.partial_score is not None]),
            "worker_errors": self.worker_errors,
            "store_executions": stats["executions"],
            "store_tree_tokens": stats["tree_tokens"],
            "store_naive_tokens": stats["naive_tokens"],
            "dedup_ratio": stats["dedup_ratio"],
            "learner_steps": len(self.metrics),
            "trained_executions": self.trained,
            "policy_version": version,
            "staleness_mean": round(versions_behind, 3),
            "staleness_max": float(max(st_max)) if st_max else 0.0,
            "dis_masked_frac": round(float((tok * masked).sum() / tok.sum()), 4) if tok.sum() > 0 else 0.0,
            "backlog_max": max((row["backlog"] for row in self.timeline), default=0.0),
            "ingest_lag_max": max((row["ingest_lag"] for row in self.timeline), default=0.0),
            "time_capped": timed_out,
            "seconds_pretrain": round(pre.seconds, 1) if not cached else 0.0,
            "pretrain_loss": round(pre.losses[-1], 4) if pre.losses else float("nan"),
            "pretrain_clean_steps": pre.clean_steps,
            "pretrain_converged": pre.converged,
            "seconds_eval_start": round(eval_s, 1),
            "seconds_async": round(rl_s, 1),
            "seconds_total": round(total_s, 1),
            "out_dir": str(self.out_dir),
            "database_url": _redact(self.database_url),
        }

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


def _redact(url: str) -> str:
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return "<unparseable url>"


def run_demo(cfg: DemoConfig | None = None, *, hook: ProgressHook | None = None) -> DemoResult:
    """Run the demo once (see the module docstring)."""
    return _Demo(cfg or DemoConfig(), hook).run()
