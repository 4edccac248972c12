"""Learner configuration: dataclasses with a docstring under every field.

Defaults follow the seeds (CompactionRL + SAO) where they give numbers; where
they are silent the choice is stated in the field's docstring.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from sapwood.learner.errors import ConfigError
from sapwood.learner.horizon import DEFAULT_HORIZON_TOKENS, lam_for_horizon
from sapwood.platform.tree import RewardPolicy

__all__ = [
    "DEFAULT_JMAX",
    "AdvantageConfig",
    "CriticConfig",
    "DISWindow",
    "ForkWeighting",
    "LearnerConfig",
    "LossAggregation",
    "OptimConfig",
    "PolicyLossConfig",
    "PolicyLossKind",
    "SourceConfig",
    "check_jmax",
]

DEFAULT_JMAX = 8
"""Default Jmax: at most this many trajectories (leaves) of one execution per batch."""


def check_jmax(jmax: int) -> int:
    """Return ``jmax`` if it is a valid Jmax (an int >= 1); raise ``ConfigError`` otherwise.

    Jmax bounds the trajectories of one execution per batch; 0 or less would keep no leaf at all.
    """
    if isinstance(jmax, bool) or not isinstance(jmax, int):
        raise ConfigError(f"jmax must be an int >= 1 (trajectories per execution), got {jmax!r}")
    if jmax < 1:
        raise ConfigError(f"jmax must be >= 1 (trajectories per execution), got {jmax}")
    return jmax

LossAggregation = Literal["token", "segment_mean"]
"""``"token"``: sum over trainable tokens / |M| (CompactionRL, default). ``"segment_mean"``: mean per
segment, then mean over segments (the ablation baseline that over-weights heavily compacted tasks)."""

ForkWeighting = Literal["path", "unit"]
"""``"path"``: each token weighs its path probability ``1/(d_1⋯d_k)`` below forks of kept degrees
``d`` (default; an execution weighs one trajectory whatever its forks). ``"unit"``: every unique
token weighs 1 (the ablation baseline: a forking execution weighs more, the more it forks)."""

PolicyLossKind = Literal["dis", "ppo"]
"""``"dis"``: decoupled importance sampling with the hard two-sided mask (SAO). ``"ppo"``: PPO clip."""


@dataclass(frozen=True)
class DISWindow:
    """Two-sided DIS trust window: a token is kept iff ``1 - eps_low < ratio < 1 + eps_high``."""

    eps_low: float
    """Lower half-width; the window's lower edge is ``1 - eps_low`` (>= 1 keeps every small ratio)."""
    eps_high: float
    """Upper half-width; the window's upper edge is ``1 + eps_high``."""

    def __post_init__(self) -> None:
        if not (self.eps_low > 0 and self.eps_high > 0):
            raise ConfigError(f"DIS window half-widths must be > 0, got ({self.eps_low}, {self.eps_high})")


def _default_windows() -> dict[str, DISWindow]:
    return {"math": DISWindow(0.3, 5.0), "swe": DISWindow(0.8, 3.0)}


@dataclass(frozen=True)
class AdvantageConfig:
    """Tree GAE parameters (Skip-Observation + cross-trajectory GAE)."""

    gamma: float = 1.0
    """Discount per trainable token. 1.0, as usual for LLM RL with a terminal reward."""
    lam: float | None = None
    """GAE lambda for the policy advantages, an explicit override; None (default) derives it from
    ``horizon_tokens`` (``effective_lam``). Cross-trajectory GAE discounts a segment by
    ``(gamma*lam)**N_{>s}`` with N counted in trainable tokens, so a fixed lam such as 0.999 leaves
    early segments of long rollouts almost no credit (see ``sapwood.learner.horizon``)."""
    horizon_tokens: float = DEFAULT_HORIZON_TOKENS
    """Effective horizon H in trainable tokens behind the default ``lam = 1 - 1/H``: a segment followed
    by N trainable tokens keeps about ``exp(-N/H)`` of its credit. Default 100K (lam = 0.99999)."""
    returns_lam: float | None = 1.0
    """GAE lambda for the critic's targets (decoupled GAE, as in VAPO); ``None`` uses ``lam``.
    1.0 makes the target the local Monte-Carlo return, unbiased by the critic itself."""

    @property
    def effective_lam(self) -> float:
        """The policy advantages' lambda: ``lam`` if set, else ``1 - 1/horizon_tokens``."""
        return lam_for_horizon(self.horizon_tokens) if self.lam is None else self.lam

    def __post_init__(self) -> None:
        if not 0.0 <= self.gamma <= 1.0:
            raise ConfigError(f"gamma must be in [0, 1], got {self.gamma}")
        if self.lam is not None and not 0.0 <= self.lam <= 1.0:
            raise ConfigError(f"lam must be in [0, 1] or None (derived from horizon_tokens), got {self.lam}")
        lam_for_horizon(self.horizon_tokens)  # raises on H < 1
        if self.returns_lam is not None and not 0.0 <= self.returns_lam <= 1.0:
            raise ConfigError(f"returns_lam must be in [0, 1] or None, got {self.returns_lam}")


@dataclass(frozen=True)
class PolicyLossConfig:
    """Policy objective."""

    kind: PolicyLossKind = "dis"
    """``"dis"`` (SAO, default) or ``"ppo"`` (clipped surrogate, for comparison)."""
    dis_windows: dict[str, DISWindow] = field(default_factory=_default_windows)
    """Per task family DIS windows; seeds: math (0.3, 5.0), swe (0.8, 3.0)."""
    dis_default_window: DISWindow = DISWindow(0.3, 5.0)
    """Window of families not in ``dis_windows``: the seeds' reasoning-task window (0.3, 5.0)."""
    ppo_clip_low: float = 0.2
    """PPO: lower clip half-width (ratio clipped to ``1 - ppo_clip_low``)."""
    ppo_clip_high: float = 0.2
    """PPO: upper clip half-width (ratio clipped to ``1 + ppo_clip_high``)."""
    ppo_old_logprob: Literal["rollout", "recompute"] = "rollout"
    """PPO's pi_old: the logged rollout log-probs, or the learner's own log-probs recomputed
    before the update (with one update per batch that makes the ratio 1 at the start)."""
    aggregation: LossAggregation = "token"
    """Loss aggregation of policy and value losses: ``"token"`` (|M|) or the ``"segment_mean"`` ablation."""
    fork_weighting: ForkWeighting = "path"
    """Token weights of policy and value losses: ``"path"`` (the batch's ``token_weight``, path
    probabilities by default) or the ``"unit"`` ablation."""

    def window(self, family: str) -> DISWindow:
        """DIS window of a task family."""
        return self.dis_windows.get(family, self.dis_default_window)

    def __post_init__(self) -> None:
        if self.kind not in ("dis", "ppo"):
            raise ConfigError(f"policy loss kind must be 'dis' or 'ppo', got {self.kind!r}")
        if self.aggregation not in ("token", "segment_mean"):
            raise ConfigError(f"aggregation must be 'token' or 'segment_mean', got {self.aggregation!r}")
        if self.fork_weighting not in ("path", "unit"):
            raise ConfigError(f"fork_weighting must be 'path' or 'unit', got {self.fork_weighting!r}")
        if not (self.ppo_clip_low > 0 and self.ppo_clip_high > 0):
            raise ConfigError("PPO clip half-widths must be > 0")


@dataclass(frozen=True)
class CriticConfig:
    """The critic's "three pieces": warm-up, catch-up, stabilized value gradients."""

    warmup_steps: int = 8
    """Critic-only steps (policy frozen) before the first policy update; history replayed
    into a new run can feed them. 0 disables warm-up."""
    catchup_max_steps: int = 2
    """Extra critic-only steps on the same batch when the value loss lags; 0 disables catch-up."""
    catchup_loss_ratio: float | None = 1.5
    """The critic lags when its value loss exceeds this multiple of its running average
    (``None``: criterion off)."""
    catchup_min_explained_var: float | None = 0.0
    """The critic lags when the explained variance of the returns is below this (``None``: off)."""
    loss_ema: float = 0.9
    """Smoothing of the running value-loss average used by ``catchup_loss_ratio``."""
    value_clip: float | None = 0.2
    """Value clipping: predictions further than this from the pre-update values take the
    clipped loss (``max`` of clipped and unclipped squared errors); ``None`` disables it."""
    value_coef: float = 1.0
    """Weight of the value loss in the joint backward pass (the critic has its own optimizer)."""
    grad_clip: float | None = 1.0
    """Max global gradient norm of the critic's parameters; ``None`` disables clipping."""

    def __post_init__(self) -> None:
        if self.warmup_steps < 0 or self.catchup_max_steps < 0:
            raise ConfigError("warmup_steps and catchup_max_steps must be >= 0")
        if self.value_clip is not None and self.value_clip <= 0:
            raise ConfigError(f"value_clip must be > 0 or None, got {self.value_clip}")
        if not 0.0 <= self.loss_ema < 1.0:
            raise ConfigError(f"loss_ema must be in [0, 1), got {self.loss_ema}")


@dataclass(frozen=True)
class OptimConfig:
    """Optimizers (AdamW, one for the actor, one for the critic)."""

    actor_lr: float = 1e-4
    """Actor learning rate (for the small CPU model; large models use ~1e-6)."""
    critic_lr: float = 5e-4
    """Critic learning rate; usually higher than the actor's."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    actor_grad_clip: float | None = 1.0
    """Max global gradient norm of the actor's parameters; ``None`` disables clipping."""

    def __post_init__(self) -> None:
        if not (self.actor_lr > 0 and self.critic_lr > 0):
            raise ConfigError("learning rates must be > 0")
        if not all(math.isfinite(b) and 0 <= b < 1 for b in self.betas):
            raise ConfigError(f"betas must be in [0, 1), got {self.betas}")


@dataclass(frozen=True)
class LearnerConfig:
    """Everything one SAO training step needs."""

    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)
    """GAE parameters."""
    policy: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    """Policy objective, DIS windows, loss aggregation."""
    critic: CriticConfig = field(default_factory=CriticConfig)
    """Critic warm-up, catch-up and value-gradient stabilization."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimizers."""
    jmax: int = DEFAULT_JMAX
    """At most this many trajectories of one execution per batch (checked by ``validate``)."""

    def __post_init__(self) -> None:
        check_jmax(self.jmax)


@dataclass
class SourceConfig:
    """What a batch source claims (:mod:`sapwood.learner.claims`) and how it assembles batches
    (:mod:`sapwood.learner.assembly`)."""

    jmax: int = DEFAULT_JMAX
    """At most this many trajectories (leaves) per execution; chosen uniformly with a seed (>= 1)."""
    executions_per_batch: int = 4
    """Executions claimed per batch."""
    lease_s: float = 600.0
    """Claim lease; a crashed learner's executions are claimable again after it."""
    poll_s: float = 0.2
    """Wait between claim attempts when the run has nothing pending."""
    seed: int = 0
    """Seed of the Jmax selection."""
    reward: RewardPolicy = field(default_factory=RewardPolicy)
    """Reward policy (``sapwood.platform.tree``; the API shows rewards under its default)."""
    train_summaries: bool = True
    """False freezes the summarizer: summary tokens stay in context but are not trainable."""

    def __post_init__(self) -> None:
        check_jmax(self.jmax)
