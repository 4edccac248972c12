"""Models: a small causal transformer actor-critic and the backend interface.

``PolicyBackend`` is what a trainer needs from a model implementation: forward
log-probs/values on a ``TreeBatch``, one optimizer step driven by a loss
function, a policy version, and state save/load. ``TorchBackend`` implements it
for ``TinyActorCritic`` on CPU (or one GPU); ``megatron_backend.MegatronBackend``
implements it on megatron-core (``step`` takes the loss as a callback, the
shape of Megatron's ``forward_backward_func``).

Tree packing: the model runs once over the batch's unique tokens with the tree
attention mask (token i attends to itself and its context ancestors) and
depth-based positions, so a shared prefix is computed once. The log-prob of
token i and the value of the state before it are read from the output at
``parent[i]``.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sapwood.learner.batch import TreeBatch
from sapwood.learner.config import LearnerConfig, OptimConfig
from sapwood.learner.errors import ConfigError
from sapwood.learner.flat import FlatBatch
from sapwood.learner.losses import metric_floats

__all__ = [
    "ActorCriticBackend",
    "ForwardOutput",
    "KVCache",
    "LossFn",
    "PackedModel",
    "PolicyBackend",
    "TinyActorCritic",
    "TinyTransformerConfig",
    "TorchBackend",
    "flat_forward",
    "gather_token_outputs",
    "tree_forward",
]


@dataclass(frozen=True)
class TinyTransformerConfig:
    """Shape of ``TinyActorCritic``."""

    vocab_size: int = 256
    """Number of token ids."""
    d_model: int = 64
    """Hidden width."""
    n_heads: int = 4
    """Attention heads (must divide ``d_model``)."""
    n_layers: int = 2
    """Transformer blocks per trunk."""
    d_ff: int = 256
    """MLP width."""
    max_position: int = 4096
    """Largest position + 1 (learned position embeddings)."""
    shared_trunk: bool = False
    """False: separate actor and critic trunks (critic-only steps leave the policy untouched).
    True: one trunk with an LM head and a value head."""

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads:
            raise ConfigError(f"n_heads ({self.n_heads}) must divide d_model ({self.d_model})")


KVCache = list[tuple[Tensor, Tensor]]
"""Past keys and values of one sequence, per layer: ``[(k, v)] * n_layers``, each ``[heads, n, head_dim]``
for the ``n`` tokens at positions ``0..n-1`` (what ``TinyActorCritic.actor_step`` takes and returns)."""


class _Block(nn.Module):
    """Pre-LayerNorm transformer block using ``scaled_dot_product_attention`` with a bool mask."""

    def __init__(self, cfg: TinyTransformerConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Sequential(nn.Linear(cfg.d_model, cfg.d_ff), nn.GELU(), nn.Linear(cfg.d_ff, cfg.d_model))

    def forward(self, x: Tensor, attn_mask: Tensor) -> Tensor:
        """x: [T, D]; attn_mask: [T, T] bool (True = may attend). Returns [T, D]."""
        t, d = x.shape
        h = self.n_heads
        q, k, v = self.qkv(self.ln1(x)).view(t, 3, h, d // h).permute(1, 2, 0, 3)  # 3 x [H, T, Dh]
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)  # [H, T, Dh]
        x = x + self.proj(a.transpose(0, 1).reshape(t, d))
        return x + self.mlp(self.ln2(x))

    def step(self, x: Tensor, past: tuple[Tensor, Tensor] | None) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """Causal attention of ``t`` new tokens over ``n`` past ones. x: [t, D]; past: ``(k, v)`` each
        [H, n, Dh] or None (n = 0). Returns ``(x [t, D], (k, v) [H, n + t, Dh])``."""
        t, d = x.shape
        h = self.n_heads
        q, k, v = self.qkv(self.ln1(x)).view(t, 3, h, d // h).permute(1, 2, 0, 3)  # 3 x [H, t, Dh]
        if past is not None:
            k = torch.cat([past[0], k], dim=1)
            v = torch.cat([past[1], v], dim=1)
        n = k.shape[1] - t
        mask = torch.ones(t, n + t, dtype=torch.bool, device=x.device).tril(diagonal=n)  # new i sees j <= n + i
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # [H, t, Dh]
        x = x + self.proj(a.transpose(0, 1).reshape(t, d))
        return x + self.mlp(self.ln2(x)), (k, v)


class _Trunk(nn.Module):
    def __init__(self, cfg: TinyTransformerConfig) -> None:
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Embedding(cfg.max_position, cfg.d_model)
        self.blocks = nn.ModuleList(_Block(cfg) for _ in range(cfg.n_layers))
        self.ln = nn.LayerNorm(cfg.d_model)

    def forward(self, tokens: Tensor, position: Tensor, attn_mask: Tensor) -> Tensor:
        x = self.tok(tokens) + self.pos(position)
        for block in self.blocks:
            x = block(x, attn_mask)
        out: Tensor = self.ln(x)
        return out

    def step(self, tokens: Tensor, past: KVCache | None) -> tuple[Tensor, KVCache]:
        """Incremental causal forward: ``tokens`` [t] at positions ``n..n+t-1`` after the ``n`` tokens
        of ``past`` (None: n = 0). Returns ``(hidden [t, D], cache of n + t tokens)``."""
        n = 0 if not past else int(past[0][0].shape[1])
        position = torch.arange(n, n + int(tokens.numel()), device=tokens.device)
        x = self.tok(tokens) + self.pos(position)
        cache: KVCache = []
        for i, block in enumerate(self.blocks):
            x, kv = cast(_Block, block).step(x, past[i] if past else None)
            cache.append(kv)
        out: Tensor = self.ln(x)
        return out, cache


class TinyActorCritic(nn.Module):
    """Small causal transformer policy with a value head, for CPU tests and examples."""

    def __init__(self, cfg: TinyTransformerConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.actor = _Trunk(cfg)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.critic = None if cfg.shared_trunk else _Trunk(cfg)
        self.value_head = nn.Linear(cfg.d_model, 1)

    def forward(self, tokens: Tensor, position: Tensor, attn_mask: Tensor) -> tuple[Tensor, Tensor]:
        """Run the model on packed tokens.

        Args:
            tokens: [T] int64 token ids.
            position: [T] int64 positions (depth in the context tree).
            attn_mask: [T, T] bool, ``attn_mask[i, j]``: token i may attend to j
                (ancestors and itself for a tree, ``j <= i`` for a sequence).

        Returns:
            ``(logits [T, V], values [T])``: next-token logits and the value of the
            state after each token (i.e. before its children).
        """
        if position.numel() and int(position.max()) >= self.cfg.max_position:
            raise ConfigError(f"position {int(position.max())} >= max_position {self.cfg.max_position}")
        h = self.actor(tokens, position, attn_mask)
        logits = self.lm_head(h)
        hv = h if self.critic is None else self.critic(tokens, position, attn_mask)
        values = self.value_head(hv).squeeze(-1)
        return logits, values

    def actor_step(self, tokens: Tensor, past: KVCache | None = None) -> tuple[Tensor, KVCache]:
        """Next-token logits of ``tokens`` [t] appended to the sequence ``past`` caches (actor trunk only).

        Args:
            tokens: [t] int64 new token ids, at positions ``n..n+t-1``.
            past: ``KVCache`` of the ``n`` earlier tokens (None or empty: none).

        Returns:
            ``(logits [t, V], KVCache of n + t tokens)``; equal (to float rounding) to the logits of a
            full causal ``forward`` over all ``n + t`` tokens at the last ``t`` positions.

        Raises:
            ConfigError: a position would reach ``max_position``.
        """
        n = 0 if not past else int(past[0][0].shape[1])
        if n + int(tokens.numel()) > self.cfg.max_position:
            raise ConfigError(f"position {n + int(tokens.numel()) - 1} >= max_position {self.cfg.max_position} "
                              f"({n} cached + {int(tokens.numel())} new tokens)")
        h, cache = self.actor.step(tokens, past)
        logits: Tensor = self.lm_head(h)
        return logits, cache

    def actor_parameters(self) -> list[nn.Parameter]:
        """Parameters the policy loss trains (the shared trunk included when shared)."""
        return [*self.actor.parameters(), *self.lm_head.parameters()]

    def critic_parameters(self) -> list[nn.Parameter]:
        """Parameters only the value loss trains (value head, and the critic trunk when separate)."""
        params = list(self.value_head.parameters())
        if self.critic is not None:
            params = [*self.critic.parameters(), *params]
        return params


@dataclass(frozen=True)
class ForwardOutput:
    """Per-token model outputs on a ``TreeBatch`` (or per occurrence on a ``FlatBatch``)."""

    logprob: Tensor
    """[T] log π_θ(token_i | its context), read at ``parent[i]``; 0 at context roots."""
    values: Tensor
    """[T] V_θ of the state before token i, read at ``parent[i]``; 0 at context roots."""
    entropy: Tensor
    """[T] entropy of π_θ(· | context of token i); 0 at context roots."""


def gather_token_outputs(logits: Tensor, values: Tensor, tokens: Tensor, parent: Tensor) -> ForwardOutput:
    """Read each token's log-prob, value and entropy from its predecessor's output.

    Args:
        logits: [T, V] next-token logits at each token.
        values: [T] value after each token.
        tokens: [T] int64 token ids.
        parent: [T] int64 index of the predecessor whose output predicts token i (-1: none).

    Returns:
        ``ForwardOutput`` of [T] tensors, 0 where ``parent == -1``.
    """
    has = parent >= 0
    p = parent.clamp(min=0)
    low_precision = logits.dtype in (torch.float16, torch.bfloat16)
    logp_all = torch.log_softmax(logits.float() if low_precision else logits, dim=-1)  # [T, V]
    lp = logp_all[p].gather(1, tokens.unsqueeze(1)).squeeze(1)
    ent = -(logp_all.exp() * logp_all).sum(-1)[p]
    zero = torch.zeros((), dtype=lp.dtype, device=lp.device)
    return ForwardOutput(
        logprob=torch.where(has, lp, zero),
        values=torch.where(has, values[p].to(lp.dtype), zero),
        entropy=torch.where(has, ent, zero),
    )


PackedModel = Callable[[Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]
"""``(tokens [T], position [T], attn_mask [T, T]) -> (logits [T, V], values [T])``: ``TinyActorCritic``
or any model with its contract (the Megatron-core backend's)."""


def tree_forward(model: PackedModel, batch: TreeBatch) -> ForwardOutput:
    """One forward pass over the batch's unique tokens with the tree attention mask."""
    logits, values = model(batch.tokens, batch.position, batch.attention_mask())
    return gather_token_outputs(logits, values, batch.tokens, batch.parent)


def flat_forward(model: PackedModel, batch: TreeBatch, flat: FlatBatch) -> ForwardOutput:
    """The flattened baseline: run each sequence of ``flat`` separately with a causal mask.

    Returns:
        ``ForwardOutput`` over the N occurrences, in ``flat.cat_index()`` order.
    """
    outs: list[ForwardOutput] = []
    for index in flat.token_index:
        n = index.numel()
        causal = torch.ones(n, n, dtype=torch.bool, device=index.device).tril()
        logits, values = model(batch.tokens[index], batch.position[index], causal)
        local_parent = torch.arange(-1, n - 1, device=index.device)
        outs.append(gather_token_outputs(logits, values, batch.tokens[index], local_parent))
    return ForwardOutput(
        logprob=torch.cat([o.logprob for o in outs]),
        values=torch.cat([o.values for o in outs]),
        entropy=torch.cat([o.entropy for o in outs]),
    )


LossFn = Callable[[ForwardOutput], tuple[Tensor, Mapping[str, Tensor | float]]]
"""Maps a differentiable ``ForwardOutput`` to ``(loss, metrics)``; metrics are detached 0-d tensors
(or floats), turned into floats by ``step`` in one transfer (``losses.metric_floats``)."""


class PolicyBackend(abc.ABC):
    """What a trainer needs from a model implementation (tiny torch model, Megatron-core, ...)."""

    @property
    @abc.abstractmethod
    def policy_version(self) -> int:
        """Version of the current policy weights; incremented by every actor update."""

    @abc.abstractmethod
    def forward(self, batch: TreeBatch) -> ForwardOutput:
        """Log-probs, values, entropies of every token under the current weights, without gradients."""

    @abc.abstractmethod
    def step(self, batch: TreeBatch, loss_fn: LossFn, *, update_actor: bool, update_critic: bool) -> dict[str, float]:
        """Forward with gradients, ``loss_fn``, backward, gradient clipping, optimizer step(s).

        Only the parameter groups selected by ``update_actor`` / ``update_critic`` move.
        Returns ``loss_fn``'s metrics plus ``actor/grad_norm`` / ``critic/grad_norm``.
        """

    @abc.abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume: weights, optimizer states, policy version."""

    @abc.abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""


class ActorCriticBackend(PolicyBackend):
    """What ``TorchBackend`` and ``MegatronBackend`` share: an actor and a critic AdamW over a model's
    ``actor_parameters()`` / ``critic_parameters()``, the no-grad tree forward, the policy version, and
    the update after a backward pass (per-group gradient clipping, the selected optimizer steps).

    A subclass sets ``model`` and calls ``_setup`` with its parameter groups; it may override ``_clip``
    (e.g. to add the squared norms of tensor-parallel shards).
    """

    model: nn.Module
    """The ``PackedModel`` trained."""

    def _setup(
        self,
        actor_params: list[nn.Parameter],
        critic_params: list[nn.Parameter],
        optim: OptimConfig | None,
        critic_grad_clip: float | None,
        policy_version: int,
    ) -> None:
        """Optimizers over the two parameter groups, the critic clip and the initial policy version."""
        self.optim_config = oc = optim or OptimConfig()
        self._actor_params = actor_params
        self._critic_params = critic_params
        self.actor_opt = torch.optim.AdamW(
            self._actor_params, lr=oc.actor_lr, betas=oc.betas, weight_decay=oc.weight_decay
        )
        self.critic_opt = torch.optim.AdamW(
            self._critic_params, lr=oc.critic_lr, betas=oc.betas, weight_decay=oc.weight_decay
        )
        self.critic_grad_clip = critic_grad_clip
        self._version = policy_version

    @property
    def policy_version(self) -> int:
        return self._version

    def forward(self, batch: TreeBatch) -> ForwardOutput:
        with torch.no_grad():
            return tree_forward(self.model, batch)

    def _zero_grad(self) -> None:
        self.actor_opt.zero_grad(set_to_none=True)
        self.critic_opt.zero_grad(set_to_none=True)

    def _update(self, metrics: dict[str, Tensor | float], *, update_actor: bool, update_critic: bool) -> None:
        """After a backward pass: clip and step the selected groups (grad norms into ``metrics``), bump the
        version on an actor update, drop the gradients."""
        if update_critic:
            metrics["critic/grad_norm"] = self._clip(self._critic_params, self.critic_grad_clip)
            self.critic_opt.step()
        if update_actor:
            metrics["actor/grad_norm"] = self._clip(self._actor_params, self.optim_config.actor_grad_clip)
            self.actor_opt.step()
            self._version += 1
        self._zero_grad()

    def _clip(self, params: list[nn.Parameter], max_norm: float | None) -> Tensor | float:
        """Clip the global gradient norm of ``params`` (if ``max_norm``); return the norm before clipping
        (a 0-d tensor: not read back)."""
        grads = [p for p in params if p.grad is not None]
        if not grads:
            return 0.0
        return torch.nn.utils.clip_grad_norm_(grads, math.inf if max_norm is None else max_norm)


class TorchBackend(ActorCriticBackend):
    """``PolicyBackend`` for ``TinyActorCritic`` with two AdamW optimizers (actor, critic).

    The actor optimizer owns the actor trunk and LM head, the critic optimizer the
    value head and, when separate, the critic trunk. With a shared trunk a
    critic-only step (warm-up, catch-up) moves the value head only, so the policy
    stays fixed; in a joint step the value loss also reaches the shared trunk
    through the actor optimizer.
    """

    def __init__(
        self,
        model: TinyActorCritic,
        optim: OptimConfig | None = None,
        *,
        critic_grad_clip: float | None = 1.0,
        policy_version: int = 0,
    ) -> None:
        self.model: TinyActorCritic = model
        self._setup(model.actor_parameters(), model.critic_parameters(), optim, critic_grad_clip, policy_version)

    @classmethod
    def from_config(cls, model: TinyActorCritic, config: LearnerConfig, *, policy_version: int = 0) -> TorchBackend:
        """Backend with the optimizers of ``config.optim`` and the critic clip of ``config.critic``."""
        return cls(model, config.optim, critic_grad_clip=config.critic.grad_clip, policy_version=policy_version)

    def step(self, batch: TreeBatch, loss_fn: LossFn, *, update_actor: bool, update_critic: bool) -> dict[str, float]:
        self.model.train()
        self._zero_grad()
        out = tree_forward(self.model, batch)
        loss, loss_metrics = loss_fn(out)
        loss.backward()
        metrics = {**loss_metrics, "train/loss": loss.detach()}
        self._update(metrics, update_actor=update_actor, update_critic=update_critic)
        return metric_floats(metrics)

    def state_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "actor_opt": self.actor_opt.state_dict(),
            "critic_opt": self.critic_opt.state_dict(),
            "policy_version": self._version,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.actor_opt.load_state_dict(state["actor_opt"])
        self.critic_opt.load_state_dict(state["critic_opt"])
        self._version = int(state["policy_version"])

