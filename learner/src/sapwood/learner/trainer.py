"""One SAO training step on a ``TreeBatch``: tree forward, tree GAE, DIS/PPO + value loss.

Flow of ``SAOTrainer.train_step``:

1. validate the batch (Jmax included);
2. forward without gradients: current values V_old (and log-probs for PPO's
   "recompute" mode);
3. tree GAE (Skip-Observation, cross-trajectory, fork means) → Â and returns;
4. critic warm-up: the first ``critic.warmup_steps`` steps (replayed history
   through ``warmup_critic`` counts too) update the critic only;
5. otherwise one joint step: policy loss (DIS by default) + value loss, each
   parameter group gradient-clipped and stepped by its own optimizer;
   (a batch without trainable tokens is validated and skipped: no step, no new version);
6. catch-up: while the value loss lags (above ``catchup_loss_ratio`` × its running
   average, or explained variance below ``catchup_min_explained_var``), up to
   ``catchup_max_steps`` extra critic-only steps on the same batch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import Tensor

from sapwood.learner.advantages import GAEResult, batch_gae
from sapwood.learner.batch import TreeBatch
from sapwood.learner.config import LearnerConfig, PolicyLossConfig
from sapwood.learner.losses import (
    dis_policy_loss,
    metric_floats,
    ppo_clip_policy_loss,
    staleness_metrics,
    value_loss,
)
from sapwood.learner.model import ForwardOutput, PolicyBackend

__all__ = ["LossTargets", "SAOTrainer", "compute_losses", "token_windows"]


def token_windows(batch: TreeBatch, config: PolicyLossConfig) -> tuple[Tensor, Tensor]:
    """Per-token DIS half-widths from each token's execution's task family.

    Returns:
        ``(eps_low [T], eps_high [T])`` float32.
    """
    windows = [config.window(f) for f in batch.task_family]
    lo = torch.tensor([w.eps_low for w in windows], dtype=torch.float32, device=batch.device)
    hi = torch.tensor([w.eps_high for w in windows], dtype=torch.float32, device=batch.device)
    if not windows:
        return torch.zeros(0, device=batch.device), torch.zeros(0, device=batch.device)
    return lo[batch.execution], hi[batch.execution]


@dataclass(frozen=True)
class LossTargets:
    """Everything the losses need besides the model outputs; per-token [N] tensors."""

    mask: Tensor
    """[N] bool trainable tokens (M)."""
    rollout_logprob: Tensor
    """[N] logged log π_rollout."""
    old_logprob: Tensor
    """[N] PPO's log π_old (rollout or recomputed, per config)."""
    advantages: Tensor
    """[N] Â."""
    returns: Tensor
    """[N] critic targets."""
    old_values: Tensor
    """[N] values when the targets were computed (value clipping reference)."""
    eps_low: Tensor
    """[N] DIS lower half-width."""
    eps_high: Tensor
    """[N] DIS upper half-width."""
    segment: Tensor
    """[N] int64 segment id (first token of the segment), for ``"segment_mean"``."""
    weight: Tensor | None = None
    """[N] loss weight of each token (``TreeBatch.token_weight``: path probabilities) or occurrence
    (flattened batches: its share of the token's weight); None = 1 (the ``"unit"`` ablation)."""

    @classmethod
    def build(cls, batch: TreeBatch, gae: GAEResult, old: ForwardOutput, config: PolicyLossConfig) -> LossTargets:
        """Targets of every unique token of ``batch``."""
        eps_low, eps_high = token_windows(batch, config)
        return cls(
            mask=batch.trainable,
            rollout_logprob=batch.rollout_logprob,
            old_logprob=old.logprob if config.ppo_old_logprob == "recompute" else batch.rollout_logprob,
            advantages=gae.advantages,
            returns=gae.returns,
            old_values=old.values,
            eps_low=eps_low,
            eps_high=eps_high,
            segment=batch.segment_start(),
            weight=batch.token_weight() if config.fork_weighting == "path" else None,
        )

    def select(self, index: Tensor, weight: Tensor | None) -> LossTargets:
        """Targets of token occurrences ``index`` [N] with weights [N] (the flattened baseline,
        ``FlatBatch.cat_weight``; a micro-batch's context view, ``TreeBatch.context_view``), None = 1."""
        return LossTargets(
            mask=self.mask[index],
            rollout_logprob=self.rollout_logprob[index],
            old_logprob=self.old_logprob[index],
            advantages=self.advantages[index],
            returns=self.returns[index],
            old_values=self.old_values[index],
            eps_low=self.eps_low[index],
            eps_high=self.eps_high[index],
            segment=self.segment[index],
            weight=weight,
        )


def compute_losses(
    out: ForwardOutput, targets: LossTargets, config: LearnerConfig, *, policy: bool = True
) -> tuple[Tensor, dict[str, Tensor]]:
    """Policy loss (if ``policy``) + ``value_coef`` × value loss, with their metrics (detached 0-d tensors:
    nothing is read back to the host; the backend's ``step`` turns them into floats once).

    Args:
        out: differentiable model outputs, [N] per token (or occurrence).
        targets: matching ``LossTargets``.
        config: learner configuration.
        policy: include the policy loss (False for critic-only steps).
    """
    pc, cc = config.policy, config.critic
    v_loss, metrics = value_loss(
        out.values,
        targets.old_values,
        targets.returns,
        targets.mask,
        clip=cc.value_clip,
        weight=targets.weight,
        mode=pc.aggregation,
        segment=targets.segment,
    )
    loss = cc.value_coef * v_loss
    if policy:
        if pc.kind == "dis":
            p_loss, pm = dis_policy_loss(
                out.logprob,
                targets.rollout_logprob,
                targets.advantages,
                targets.mask,
                targets.eps_low,
                targets.eps_high,
                weight=targets.weight,
                mode=pc.aggregation,
                segment=targets.segment,
            )
        else:
            p_loss, pm = ppo_clip_policy_loss(
                out.logprob,
                targets.old_logprob,
                targets.advantages,
                targets.mask,
                clip_low=pc.ppo_clip_low,
                clip_high=pc.ppo_clip_high,
                weight=targets.weight,
                mode=pc.aggregation,
                segment=targets.segment,
            )
        loss = loss + p_loss
        metrics.update(pm)
        w = targets.mask.float() if targets.weight is None else targets.weight * targets.mask.float()
        metrics["policy/entropy"] = (out.entropy.detach() * w).sum() / w.sum().clamp(min=1e-8)
    return loss, metrics


class SAOTrainer:
    """Single-rollout asynchronous critic PPO (SAO) on tree batches."""

    def __init__(self, backend: PolicyBackend, config: LearnerConfig | None = None) -> None:
        self.backend = backend
        self.config = config or LearnerConfig()
        self.steps = 0
        """Number of ``train_step`` calls."""
        self.critic_warmup_done = 0
        """Critic-only warm-up steps done (``train_step`` during warm-up and ``warmup_critic``)."""
        self.value_loss_ema: float | None = None
        """Running average of the pre-update value loss (catch-up reference)."""

    # ----------------------------------------------------------------- pieces
    def prepare(self, batch: TreeBatch) -> tuple[LossTargets, GAEResult]:
        """Validate, run the no-grad forward, compute GAE and the loss targets."""
        batch.validate(jmax=self.config.jmax)
        old = self.backend.forward(batch)
        gae = batch_gae(batch, old.values, self.config.advantage)
        return LossTargets.build(batch, gae, old, self.config.policy), gae

    def _backend_step(self, batch: TreeBatch, targets: LossTargets, *, policy: bool) -> dict[str, float]:
        """One backend update: the critic, and the actor too when ``policy``."""
        return self.backend.step(
            batch,
            lambda out: compute_losses(out, targets, self.config, policy=policy),
            update_actor=policy,
            update_critic=True,
        )

    def _critic_only(self, batch: TreeBatch, targets: LossTargets) -> dict[str, float]:
        return self._backend_step(batch, targets, policy=False)

    def _lagging(self, metrics: dict[str, float]) -> bool:
        cc = self.config.critic
        loss = metrics["critic/value_loss"]
        ema = self.value_loss_ema
        if cc.catchup_loss_ratio is not None and ema is not None and loss > cc.catchup_loss_ratio * ema:
            return True
        ev = metrics.get("critic/explained_var", math.nan)
        return cc.catchup_min_explained_var is not None and not math.isnan(ev) and (ev < cc.catchup_min_explained_var)

    def _update_ema(self, loss: float) -> None:
        beta = self.config.critic.loss_ema
        self.value_loss_ema = loss if self.value_loss_ema is None else beta * self.value_loss_ema + (1 - beta) * loss

    def policy_update(self, batch: TreeBatch, targets: LossTargets) -> dict[str, float]:
        """The joint actor + critic update of a step (a learner group splits it into micro-batches)."""
        return self._backend_step(batch, targets, policy=True)

    # ------------------------------------------------------------------ steps
    def critic_step(self, batch: TreeBatch) -> dict[str, float]:
        """One critic-only step on ``batch`` (counts as warm-up)."""
        targets, _ = self.prepare(batch)
        metrics = self._critic_only(batch, targets)
        self._update_ema(metrics["critic/value_loss"])
        self.critic_warmup_done += 1
        return metrics

    def warmup_critic(self, batches: Iterable[TreeBatch]) -> list[dict[str, float]]:
        """Critic warm-up from (replayed) batches before any policy update."""
        return [self.critic_step(b) for b in batches]

    def train_step(self, batch: TreeBatch) -> dict[str, float]:
        """One SAO step on ``batch``; returns namespaced metrics."""
        cfg = self.config
        version = self.backend.policy_version
        if not bool(batch.trainable.any()):
            batch.validate(jmax=cfg.jmax)
            self.steps += 1
            return {"train/skipped_empty": 1.0, "train/unique_tokens": float(batch.num_tokens)}
        targets, gae = self.prepare(batch)
        warmup = self.critic_warmup_done < cfg.critic.warmup_steps
        if warmup:
            metrics = self._critic_only(batch, targets)
            self.critic_warmup_done += 1
        else:
            metrics = self.policy_update(batch, targets)
        catchup = 0
        latest = metrics
        if not warmup:
            while catchup < cfg.critic.catchup_max_steps and self._lagging(latest):
                latest = self._critic_only(batch, targets)
                catchup += 1
        self._update_ema(metrics["critic/value_loss"])
        if catchup:
            metrics["critic/value_loss_after_catchup"] = latest["critic/value_loss"]
        mask = batch.trainable
        adv = gae.advantages[mask]
        zero = torch.zeros((), device=adv.device)
        # Read back in one transfer (one device sync), with the staleness metrics.
        extra: dict[str, Tensor | float] = {
            **staleness_metrics(batch.policy_version, mask, version, targets.weight),
            "adv/mean": adv.mean() if adv.numel() else zero,
            "adv/std": adv.std() if adv.numel() > 1 else zero,
            "adv/discount_mean": gae.discount[mask].mean() if adv.numel() else zero,
            "train/critic_warmup": float(warmup),
            "train/catchup_steps": float(catchup),
            "train/policy_version": float(self.backend.policy_version),
            "train/trainable_tokens": mask.sum(),
            # |M| of the loss: Σ token weights over the trainable tokens (= trainable_tokens with unit weights).
            "train/trainable_weight": mask.sum() if targets.weight is None else targets.weight[mask].sum(),
            "train/unique_tokens": float(batch.num_tokens),
        }
        metrics.update(metric_floats(extra))
        self.steps += 1
        return metrics
