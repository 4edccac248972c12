"""The demo's configuration (:class:`DemoConfig`), its result (:class:`DemoResult`) and progress hook."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from sapwood.demo.pretrain import PretrainConfig
from sapwood.demo.tasks import KeyRecallConfig
from sapwood.demo.worker import ExecutionReport
from sapwood.learner.backends import BACKENDS
from sapwood.learner.config import (
    DEFAULT_JMAX,
    AdvantageConfig,
    CriticConfig,
    LearnerConfig,
    OptimConfig,
    PolicyLossConfig,
)
from sapwood.learner.model import TinyTransformerConfig
from sapwood.platform.errors import ValidationError

__all__ = ["TASK_FAMILY", "DemoConfig", "DemoResult", "ProgressHook"]

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
    jmax: int = DEFAULT_JMAX
    """At most this many trajectories of one execution per batch (>= 1)."""
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
