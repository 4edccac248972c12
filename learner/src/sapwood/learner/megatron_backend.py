"""``PolicyBackend`` on megatron-core: ``MegatronActorCritic`` trained with an actor and a critic AdamW.

The backend does what ``TorchBackend`` does (tree-packed forward, log-probs and values read at
``parent[i]``, one backward pass through ``loss_fn``, per-group gradient clipping and optimizer
steps, a policy version) on megatron-core ``GPTModel`` trunks, inside megatron's parallel state:

* tensor parallel: the model is sharded by megatron's column/row-parallel layers; gradient norms
  add the squared norms of sharded parameters over the tensor-parallel group and count replicated
  ones once, so clipping matches the unsharded model;
* data parallel: each data-parallel rank trains its own sub-batch (whole executions). Its loss is
  scaled by its share of the global loss denominator (``loss_denominator``: trainable tokens for
  ``"token"`` aggregation, trained segments for ``"segment_mean"``) and the gradients are summed
  over the data-parallel group, so the step equals one rank's step on the whole batch. Megatron's
  own ``DistributedDataParallel`` is not used: its gradient buffers are allocated on
  ``torch.cuda.current_device()``, which fails on a CPU-only machine. The returned metrics are
  share-weighted means over the ranks (identical everywhere, so trainer decisions such as critic
  catch-up stay in lockstep; exact for the losses, an approximation for ratios and extremes).

Checkpoints (``state_dict``) carry the full weights in ``TinyActorCritic`` layout under ``"model"``
(what ``LocalTorchEngine`` loads, and what ``TorchBackend`` loads), this rank's megatron shards,
the optimizer states and the policy version.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from sapwood.learner.batch import TreeBatch
from sapwood.learner.config import ForkWeighting, LearnerConfig, LossAggregation, OptimConfig
from sapwood.learner.errors import ConfigError
from sapwood.learner.losses import metric_floats
from sapwood.learner.megatron_model import MegatronActorCritic, megatron_to_tiny, tiny_to_megatron
from sapwood.learner.megatron_parallel import all_reduce_sum, init_parallel, megatron_parallel_state
from sapwood.learner.model import ActorCriticBackend, LossFn, TinyTransformerConfig, tree_forward

__all__ = ["MegatronBackend", "loss_denominator"]


def loss_denominator(batch: TreeBatch, aggregation: LossAggregation, fork_weighting: ForkWeighting = "path") -> float:
    """What the batch's loss averages over: |M| (``"token"``: the trainable tokens' summed path weights, or
    their count with ``fork_weighting="unit"``) or the number of segments with trainable tokens."""
    if aggregation == "token":
        if fork_weighting == "path":
            return float(batch.execution_weight().sum())
        return float(batch.trainable.sum())
    if aggregation == "segment_mean":
        return float(torch.unique(batch.segment_start()[batch.trainable]).numel())
    raise ConfigError(f"unknown loss aggregation {aggregation!r}; expected 'token' or 'segment_mean'")


class MegatronBackend(ActorCriticBackend):
    """``PolicyBackend`` for ``MegatronActorCritic`` (see the module docstring).

    Args:
        model_config: model shape (the same ``TinyTransformerConfig`` as ``TorchBackend``'s model).
        optim: learning rates, betas, weight decay, actor gradient clip.
        critic_grad_clip: max gradient norm of the critic's parameters (None: no clipping).
        policy_version: version of the initial weights.
        dtype: parameter dtype (float32; float64 for equivalence tests).
        tensor_parallel: tensor-parallel size (the world size divided by it is the data-parallel size).
        aggregation: the loss aggregation of the trainer (weights of the data-parallel ranks).
        fork_weighting: the trainer's token weighting (``"path"`` probabilities or ``"unit"``), for the same.
        init_state: initial weights as a ``TinyActorCritic`` state dict (e.g. a ``TorchBackend``
            model's, or a pre-trained policy); None: megatron's initialization seeded by ``seed``.
        seed: seed of megatron's initialization (the same on every rank, so shards agree).
        data_parallel: False: this replica trains alone whatever the world's size (no gradient or metric
            reduction; a caller combines its gradients, as the learner group on the cells does with
            micro-batches); its world's data-parallel ranks are not its peers.
    """

    def __init__(
        self,
        model_config: TinyTransformerConfig,
        optim: OptimConfig | None = None,
        *,
        critic_grad_clip: float | None = 1.0,
        policy_version: int = 0,
        dtype: torch.dtype = torch.float32,
        tensor_parallel: int = 1,
        aggregation: LossAggregation = "token",
        fork_weighting: ForkWeighting = "path",
        init_state: dict[str, Tensor] | None = None,
        seed: int = 0,
        data_parallel: bool = True,
    ) -> None:
        if aggregation not in ("token", "segment_mean"):
            raise ConfigError(f"aggregation must be 'token' or 'segment_mean', got {aggregation!r}")
        self.layout = init_parallel(tensor_parallel)
        self._dp = self.layout.data_parallel if data_parallel else 1
        """Ranks this backend's gradients and metrics are reduced over (1: none)."""
        ps = megatron_parallel_state()
        self._tp_group = ps.get_tensor_model_parallel_group()
        self._dp_group = ps.get_data_parallel_group()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.model: MegatronActorCritic = MegatronActorCritic(model_config, dtype=dtype)
        if init_state is not None:
            self.load_tiny_state(init_state)
        self.aggregation: LossAggregation = aggregation
        self.fork_weighting: ForkWeighting = fork_weighting
        self._setup(self.model.actor_parameters(), self.model.critic_parameters(), optim, critic_grad_clip,
                    policy_version)

    @classmethod
    def from_config(cls, model_config: TinyTransformerConfig, config: LearnerConfig, **kw: Any) -> MegatronBackend:
        """Backend with ``config``'s optimizers, critic clip and loss aggregation."""
        return cls(model_config, config.optim, critic_grad_clip=config.critic.grad_clip,
                   aggregation=config.policy.aggregation, fork_weighting=config.policy.fork_weighting, **kw)

    # ------------------------------------------------------------------ weights
    def load_tiny_state(self, state: dict[str, Tensor]) -> None:
        """Load full ``TinyActorCritic``-layout weights (this rank keeps its shards)."""
        mapped = tiny_to_megatron(state, self.model.cfg, tensor_parallel=self.layout.tensor_parallel,
                                  tp_rank=self.layout.tp_rank)
        dtype = next(self.model.parameters()).dtype
        self.model.load_state_dict({k: v.to(dtype) for k, v in mapped.items()}, strict=True)

    def tiny_state_dict(self) -> dict[str, Tensor]:
        """The full weights in ``TinyActorCritic`` layout (a collective under tensor parallelism)."""
        return megatron_to_tiny(self.model)

    # ------------------------------------------------------------- interface
    def step(self, batch: TreeBatch, loss_fn: LossFn, *, update_actor: bool, update_critic: bool) -> dict[str, float]:
        metrics: dict[str, Tensor | float] = {**self._backward(batch, loss_fn)}
        self._update(metrics, update_actor=update_actor, update_critic=update_critic)
        return metric_floats(metrics)

    def gradients(self, batch: TreeBatch, loss_fn: LossFn) -> tuple[dict[str, Tensor], dict[str, float]]:
        """Gradients of the global loss without a step: forward, backward, data-parallel reduction.

        Returns:
            ``(grads, metrics)``: the full gradients in ``TinyActorCritic`` layout (gathered over the
            tensor-parallel ranks, summed over the data-parallel ones), and ``step``'s loss metrics.
        """
        metrics = self._backward(batch, loss_fn)
        grads = megatron_to_tiny(self.model, grads=True)
        self._zero_grad()
        return grads, metrics

    def _backward(self, batch: TreeBatch, loss_fn: LossFn) -> dict[str, float]:
        """Fresh gradients of the global loss on every rank; returns the (data-parallel reduced) metrics."""
        self.model.train()
        self._zero_grad()
        out = tree_forward(self.model, batch)
        loss, metrics = loss_fn(out)
        share = self._dp_share(batch)
        (loss * share).backward()
        metrics = self._dp_metrics({**metrics, "train/loss": loss.detach()}, share)
        if self._dp > 1:
            self._reduce_grads([*self._actor_params, *self._critic_params])
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return {
            "model": self.tiny_state_dict(),
            "megatron": self.model.state_dict(),
            "actor_opt": self.actor_opt.state_dict(),
            "critic_opt": self.critic_opt.state_dict(),
            "policy_version": self._version,
            "backend_kind": "megatron",
            "tensor_parallel": self.layout.tensor_parallel,
            "tp_rank": self.layout.tp_rank,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a checkpoint of this backend, or the weights and version of a ``TorchBackend`` one.

        Optimizer states are restored only from a megatron checkpoint of the same tensor-parallel
        layout (a ``TorchBackend`` checkpoint orders its parameters differently): otherwise fresh.
        """
        same_layout = (state.get("backend_kind") == "megatron"
                       and state.get("tensor_parallel") == self.layout.tensor_parallel
                       and state.get("tp_rank") == self.layout.tp_rank)
        if same_layout:
            self.model.load_state_dict(state["megatron"], strict=True)
            self.actor_opt.load_state_dict(state["actor_opt"])
            self.critic_opt.load_state_dict(state["critic_opt"])
        else:
            self.load_tiny_state(state["model"])
        self._version = int(state["policy_version"])

    # ------------------------------------------------------------- parallel
    def _dp_share(self, batch: TreeBatch) -> float:
        """This rank's share of the global loss denominator (1 without data parallelism)."""
        dp = self._dp
        if dp == 1:
            return 1.0
        den = torch.tensor([loss_denominator(batch, self.aggregation, self.fork_weighting)], dtype=torch.float64)
        total = float(all_reduce_sum(den.clone(), self._dp_group))
        return float(den) / total if total > 0 else 1.0 / dp

    def _dp_metrics(self, metrics: Mapping[str, Tensor | float], share: float) -> dict[str, float]:
        """Floats of the metrics (read back in one transfer); under data parallelism their share-weighted
        sums over the ranks (same keys on every rank)."""
        floats = metric_floats(metrics)
        if self._dp == 1:
            return floats
        keys = sorted(floats)
        vals = torch.tensor([floats[k] * share for k in keys], dtype=torch.float64)
        all_reduce_sum(vals, self._dp_group)
        return dict(zip(keys, vals.tolist(), strict=True))

    def _reduce_grads(self, params: list[nn.Parameter]) -> None:
        """Sum the gradients over the data-parallel group in one flat buffer (missing grads as zeros)."""
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        grads = [p.grad for p in params if p.grad is not None]
        flat = torch.cat([g.reshape(-1) for g in grads])
        all_reduce_sum(flat, self._dp_group)
        offset = 0
        for g in grads:
            n = g.numel()
            g.copy_(flat[offset : offset + n].view_as(g))
            offset += n

    def _clip(self, params: list[nn.Parameter], max_norm: float | None) -> Tensor | float:
        """Clip the global gradient norm of ``params`` over the tensor-parallel shards; return it before clipping."""
        if self.layout.tensor_parallel == 1:
            return super()._clip(params, max_norm)
        grads = [p for p in params if p.grad is not None]
        if not grads:
            return 0.0
        limit = math.inf if max_norm is None else max_norm
        sharded = torch.zeros((), dtype=torch.float64)
        replicated = torch.zeros((), dtype=torch.float64)
        for p in grads:
            assert p.grad is not None
            sq = p.grad.detach().double().pow(2).sum()
            if getattr(p, "tensor_model_parallel", False):
                sharded += sq
            else:
                replicated += sq
        dist.all_reduce(sharded, group=self._tp_group)
        norm = float((sharded + replicated).sqrt())
        coef = min(1.0, limit / (norm + 1e-6))
        if coef < 1.0:
            for p in grads:
                assert p.grad is not None
                p.grad.mul_(coef)
        return norm
