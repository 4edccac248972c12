"""The actor-critic on megatron-core's ``GPTModel``, with tree attention, and its weight mapping.

``MegatronActorCritic`` has the shape of ``TinyActorCritic`` (same ``TinyTransformerConfig``): a
``GPTModel`` actor built from ``get_gpt_layer_local_spec()`` (pre-LayerNorm blocks, fused QKV
``linear_qkv``, ``linear_proj``, MLP ``linear_fc1``/GELU/``linear_fc2``, learned absolute
positions, an untied output layer), a ``GPTModel`` critic trunk without output layer plus a final
LayerNorm (or none with ``shared_trunk``), and a value head. The layer spec's core attention is
``tree_core_attention()``: torch ``scaled_dot_product_attention`` with the given boolean mask, so the
tree mask and depth positions of a ``TreeBatch`` go straight through megatron's layers and a
shared prefix is computed once.

Tensor parallel: the output layer stays vocab-parallel and the logits are gathered by
``_GatherLastDim`` (all-gather forward, own-slice backward, any backend); megatron's own gather
(``gather_output=True``) does the same but allocates its buffer with ``torch.cuda.current_device()``
and fails on a CPU-only machine.

Weight mapping (``tiny_to_megatron`` / ``megatron_to_tiny``): the tiny model's QKV rows are
ordered (q|k|v, head, dim), megatron's (head, q|k|v, dim); column-parallel weights (QKV, fc1,
embeddings, output layer) are split along rows and row-parallel ones (``linear_proj``, fc2) along
columns over the tensor-parallel ranks; LayerNorms, position embeddings, row-parallel biases and
the value head are replicated.
"""

from __future__ import annotations

import warnings
from typing import Any, Literal

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from sapwood.learner.errors import ConfigError
from sapwood.learner.megatron_parallel import megatron_parallel_state
from sapwood.learner.model import TinyTransformerConfig

__all__ = ["MegatronActorCritic", "megatron_to_tiny", "tiny_to_megatron", "tree_core_attention",
           "tree_layer_spec", "weight_map"]

Split = Literal["rep", "col", "row", "qkv"]


def _megatron() -> Any:
    """The megatron-core modules used here (imported lazily, CPU-import warnings silenced)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        from megatron.core.models.gpt import GPTModel
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
        from megatron.core.transformer.module import MegatronModule
        from megatron.core.transformer.transformer_config import TransformerConfig
    return GPTModel, get_gpt_layer_local_spec, MegatronModule, TransformerConfig


def _tree_core_attention_class() -> type:
    _, _, MegatronModule, _ = _megatron()

    class _TreeCoreAttention(MegatronModule):  # type: ignore[misc, valid-type]
        """Core attention taking megatron's boolean mask (True = masked out), for tree-packed tokens.

        Shapes: query [sq, b, np, hn], key/value [sk, b, ng, hn], ``attention_mask``
        [b or 1, 1, sq, sk] bool or None (causal); returns [sq, b, np * hn].
        """

        def __init__(self, config: Any, layer_number: int, attn_mask_type: Any, attention_type: str,
                     attention_dropout: float | None = None, softmax_scale: float | None = None,
                     cp_comm_type: str | None = None, pg_collection: Any = None) -> None:
            super().__init__(config=config)
            if config.context_parallel_size > 1:
                raise ConfigError("tree attention does not support context parallelism")
            self.layer_number = layer_number
            self.softmax_scale = softmax_scale
            self.dropout_p = config.attention_dropout if attention_dropout is None else attention_dropout

        def forward(self, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
                    attn_mask_type: Any = None, attention_bias: Tensor | None = None,
                    packed_seq_params: Any = None) -> Tensor:
            if attention_bias is not None or packed_seq_params is not None:
                raise ConfigError("tree attention takes a boolean mask, not attention_bias / packed_seq_params")
            sq, b, heads, _ = query.shape
            q, k, v = (x.permute(1, 2, 0, 3) for x in (query, key, value))  # [b, heads, s, hn]
            if k.shape[1] != heads:  # grouped-query attention
                k = k.repeat_interleave(heads // k.shape[1], dim=1)
                v = v.repeat_interleave(heads // v.shape[1], dim=1)
            allowed = None if attention_mask is None else ~attention_mask
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, is_causal=attention_mask is None,
                                                 dropout_p=self.dropout_p if self.training else 0.0,
                                                 scale=self.softmax_scale)
            return out.permute(2, 0, 1, 3).reshape(sq, b, -1)

    return _TreeCoreAttention


_TREE_ATTENTION: type | None = None


def tree_core_attention() -> type:
    """The tree core-attention module class (built on first use so that megatron is imported lazily)."""
    global _TREE_ATTENTION
    if _TREE_ATTENTION is None:
        _TREE_ATTENTION = _tree_core_attention_class()
    return _TREE_ATTENTION


def tree_layer_spec() -> Any:
    """``get_gpt_layer_local_spec()`` with its core attention swapped for ``tree_core_attention()``."""
    _, get_gpt_layer_local_spec, _, _ = _megatron()
    spec = get_gpt_layer_local_spec()
    spec.submodules.self_attention.submodules.core_attention = tree_core_attention()
    return spec


def transformer_config(cfg: TinyTransformerConfig, *, dtype: torch.dtype, tensor_parallel: int) -> Any:
    """Megatron ``TransformerConfig`` matching ``TinyActorCritic``: LayerNorm eps 1e-5, exact GELU, biases,
    no dropout, CPU initialization, no fused kernels."""
    _, _, _, TransformerConfig = _megatron()
    if cfg.n_heads % tensor_parallel or cfg.vocab_size % tensor_parallel or cfg.d_ff % tensor_parallel:
        raise ConfigError(f"tensor_parallel={tensor_parallel} must divide n_heads ({cfg.n_heads}), "
                          f"vocab_size ({cfg.vocab_size}) and d_ff ({cfg.d_ff})")
    return TransformerConfig(
        num_layers=cfg.n_layers, hidden_size=cfg.d_model, num_attention_heads=cfg.n_heads,
        ffn_hidden_size=cfg.d_ff, tensor_model_parallel_size=tensor_parallel, hidden_dropout=0.0,
        attention_dropout=0.0, layernorm_epsilon=1e-5, add_bias_linear=True, activation_func=F.gelu,
        normalization="LayerNorm", use_cpu_initialization=True, params_dtype=dtype,
        bias_activation_fusion=False, bias_dropout_fusion=False, masked_softmax_fusion=False,
        gradient_accumulation_fusion=False, persist_layer_norm=False, apply_rope_fusion=False,
    )


class _GatherLastDim(torch.autograd.Function):
    """All-gather along the last dim over a tensor-parallel group; backward keeps this rank's slice.

    Every rank then computes the same loss from the gathered tensor, so the gradient of its slice
    is already complete: no sum over ranks (``torch.distributed.nn.functional.all_gather`` sums,
    which would multiply the actor's gradients by the group size). Megatron's own gather does the
    same but allocates on ``torch.cuda.current_device()``.
    """

    @staticmethod
    def forward(ctx: Any, x: Tensor, group: Any) -> Tensor:
        ctx.group = group
        ctx.rank = dist.get_rank(group)
        ctx.width = x.shape[-1]
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return grad[..., ctx.rank * ctx.width : (ctx.rank + 1) * ctx.width].contiguous(), None


class MegatronActorCritic(nn.Module):
    """``TinyActorCritic``'s interface on megatron-core ``GPTModel`` trunks (see the module docstring)."""

    def __init__(self, cfg: TinyTransformerConfig, *, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        GPTModel, _, _, _ = _megatron()
        ps = megatron_parallel_state()
        self.cfg = cfg
        self.tensor_parallel = int(ps.get_tensor_model_parallel_world_size())
        self.tp_group = ps.get_tensor_model_parallel_group()
        with warnings.catch_warnings():  # megatron's deprecation notes on options this model does not use
            warnings.simplefilter("ignore", UserWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            tcfg = transformer_config(cfg, dtype=dtype, tensor_parallel=self.tensor_parallel)
            common: dict[str, Any] = {"config": tcfg, "transformer_layer_spec": tree_layer_spec(),
                                      "vocab_size": cfg.vocab_size, "max_sequence_length": cfg.max_position,
                                      "position_embedding_type": "learned_absolute",
                                      "share_embeddings_and_output_weights": False}
            self.actor = GPTModel(**common, parallel_output=True)
            self.critic = None if cfg.shared_trunk else GPTModel(**common, post_process=False)
        self.critic_norm = None if cfg.shared_trunk else nn.LayerNorm(cfg.d_model)
        self.value_head = nn.Linear(cfg.d_model, 1)
        self.to(dtype)  # megatron keeps LayerNorms and position embeddings in float32 otherwise

    def forward(self, tokens: Tensor, position: Tensor, attn_mask: Tensor) -> tuple[Tensor, Tensor]:
        """Same contract as ``TinyActorCritic.forward``.

        Args:
            tokens: [T] int64 token ids.
            position: [T] int64 depth positions.
            attn_mask: [T, T] bool, True where token i may attend to j.

        Returns:
            ``(logits [T, V], values [T])``, identical on every tensor-parallel rank.
        """
        if position.numel() and int(position.max()) >= self.cfg.max_position:
            raise ConfigError(f"position {int(position.max())} >= max_position {self.cfg.max_position}")
        ids, pos = tokens[None], position[None]  # [1, T]: megatron's batch dimension
        blocked = ~attn_mask[None, None]  # megatron's mask convention: True = may NOT attend
        h = self.actor.decoder(hidden_states=self.actor.embedding(input_ids=ids, position_ids=pos),
                               attention_mask=blocked)  # [T, 1, D], final LayerNorm applied
        logits, _ = self.actor.output_layer(h)  # [T, 1, V / tp]
        if self.tensor_parallel > 1:
            logits = _GatherLastDim.apply(logits, self.tp_group)
        if self.critic is None:
            hv = h
        else:
            assert self.critic_norm is not None
            hv = self.critic_norm(self.critic(input_ids=ids, position_ids=pos, attention_mask=blocked))
        values = self.value_head(hv)[:, 0, 0]
        return logits[:, 0], values

    def actor_parameters(self) -> list[nn.Parameter]:
        """Parameters the policy loss trains (the shared trunk included when shared)."""
        return list(self.actor.parameters())

    def critic_parameters(self) -> list[nn.Parameter]:
        """Parameters only the value loss trains (value head, and the critic trunk + norm when separate)."""
        params = list(self.value_head.parameters())
        if self.critic is not None and self.critic_norm is not None:
            params = [*self.critic.parameters(), *self.critic_norm.parameters(), *params]
        return params


# ----------------------------------------------------------------------------------------- weight mapping
def _trunk_map(cfg: TinyTransformerConfig, tiny: str, mega: str, *, final_ln: str) -> list[tuple[str, str, Split]]:
    rows: list[tuple[str, str, Split]] = [
        (f"{tiny}.tok.weight", f"{mega}.embedding.word_embeddings.weight", "col"),
        (f"{tiny}.pos.weight", f"{mega}.embedding.position_embeddings.weight", "rep"),
    ]
    for i in range(cfg.n_layers):
        t, m = f"{tiny}.blocks.{i}", f"{mega}.decoder.layers.{i}"
        rows += [
            (f"{t}.ln1.weight", f"{m}.input_layernorm.weight", "rep"),
            (f"{t}.ln1.bias", f"{m}.input_layernorm.bias", "rep"),
            (f"{t}.qkv.weight", f"{m}.self_attention.linear_qkv.weight", "qkv"),
            (f"{t}.qkv.bias", f"{m}.self_attention.linear_qkv.bias", "qkv"),
            (f"{t}.proj.weight", f"{m}.self_attention.linear_proj.weight", "row"),
            (f"{t}.proj.bias", f"{m}.self_attention.linear_proj.bias", "rep"),
            (f"{t}.ln2.weight", f"{m}.pre_mlp_layernorm.weight", "rep"),
            (f"{t}.ln2.bias", f"{m}.pre_mlp_layernorm.bias", "rep"),
            (f"{t}.mlp.0.weight", f"{m}.mlp.linear_fc1.weight", "col"),
            (f"{t}.mlp.0.bias", f"{m}.mlp.linear_fc1.bias", "col"),
            (f"{t}.mlp.2.weight", f"{m}.mlp.linear_fc2.weight", "row"),
            (f"{t}.mlp.2.bias", f"{m}.mlp.linear_fc2.bias", "rep"),
        ]
    rows += [(f"{tiny}.ln.weight", f"{final_ln}.weight", "rep"), (f"{tiny}.ln.bias", f"{final_ln}.bias", "rep")]
    return rows


def weight_map(cfg: TinyTransformerConfig) -> list[tuple[str, str, Split]]:
    """``(TinyActorCritic key, MegatronActorCritic key, split)`` for every parameter of both models, in
    ``TinyActorCritic.state_dict()`` order (so ``megatron_to_tiny`` flattens as a ``TinyActorCritic`` does)."""
    rows = _trunk_map(cfg, "actor", "actor", final_ln="actor.decoder.final_layernorm")
    rows.append(("lm_head.weight", "actor.output_layer.weight", "col"))
    if not cfg.shared_trunk:
        rows += _trunk_map(cfg, "critic", "critic", final_ln="critic_norm")
    rows += [("value_head.weight", "value_head.weight", "rep"), ("value_head.bias", "value_head.bias", "rep")]
    return rows


def _qkv_to_megatron(x: Tensor, heads: int) -> Tensor:
    """Rows (q|k|v, head, dim) -> (head, q|k|v, dim); x: [3D] or [3D, D]."""
    rest = x.shape[1:]
    return x.reshape(3, heads, -1, *rest).transpose(0, 1).reshape(x.shape)


def _qkv_to_tiny(x: Tensor, heads: int) -> Tensor:
    """Inverse of ``_qkv_to_megatron``."""
    rest = x.shape[1:]
    return x.reshape(heads, 3, -1, *rest).transpose(0, 1).reshape(x.shape)


def tiny_to_megatron(state: dict[str, Tensor], cfg: TinyTransformerConfig, *, tensor_parallel: int = 1,
                     tp_rank: int = 0) -> dict[str, Tensor]:
    """Map a ``TinyActorCritic`` state dict to this tensor-parallel rank's ``MegatronActorCritic`` state dict."""
    missing = [t for t, _, _ in weight_map(cfg) if t not in state]
    if missing:
        raise ConfigError(f"TinyActorCritic state lacks {missing[:3]} (shared_trunk={cfg.shared_trunk}?)")
    out: dict[str, Tensor] = {}
    for tiny_key, mega_key, split in weight_map(cfg):
        x = state[tiny_key]
        if split == "qkv":
            x = _qkv_to_megatron(x, cfg.n_heads)
        if split in ("col", "qkv"):
            x = x.chunk(tensor_parallel, dim=0)[tp_rank]
        elif split == "row":
            x = x.chunk(tensor_parallel, dim=1)[tp_rank]
        out[mega_key] = x.clone()
    return out


def megatron_to_tiny(model: MegatronActorCritic, *, grads: bool = False) -> dict[str, Tensor]:
    """The full ``TinyActorCritic`` state dict of ``model`` (shards gathered over the tensor-parallel ranks).

    ``grads=True``: the parameters' gradients instead (zeros where none), mapped the same way.
    """
    cfg, tp = model.cfg, model.tensor_parallel
    params = dict(model.named_parameters())
    out: dict[str, Tensor] = {}
    for tiny_key, mega_key, split in weight_map(cfg):
        p = params[mega_key]
        x = (p.grad if p.grad is not None else torch.zeros_like(p)) if grads else p.detach()
        if split != "rep" and tp > 1:
            parts = [torch.empty_like(x) for _ in range(tp)]
            dist.all_gather(parts, x.contiguous(), group=model.tp_group)
            x = torch.cat(parts, dim=1 if split == "row" else 0)
        if split == "qkv":
            x = _qkv_to_tiny(x, cfg.n_heads)
        out[tiny_key] = x.clone()
    return out
