"""Policy and value losses: pure functions of tensors and masks.

Every loss returns ``(loss, metrics)``: a scalar tensor to differentiate and a
dict of detached 0-d tensors with namespaced keys (``policy/...``, ``critic/...``).
No loss reads a value back to the host (on a GPU each read is a device sync):
``metric_floats`` turns a step's metrics into floats in one transfer.

Shapes: all per-token arguments are [N] — N unique tokens of a ``TreeBatch``
or N token occurrences of a flattened batch. ``weight`` is each term's weight:
on a tree, the token's path probability (``TreeBatch.token_weight``: 1 on shared
prefixes, ``1/(d_1⋯d_k)`` below forks, so an execution weighs as much as one of
its trajectories however often it forks); on a flattened batch, each occurrence's
share of it, so both give the same loss. None means 1 for every term. ``mask``
selects M, the trainable tokens. One function, ``aggregate``, decides how
per-token terms become a loss:

* ``"token"`` (default, CompactionRL): ``sum_{i in M} w_i x_i / |M|`` with
  ``|M| = sum_{i in M} w_i``: every trainable token of the batch counts with its
  weight, however many segments its execution has. Tokens that DIS drops stay in
  the denominator (dropping must not up-weight the others).
* ``"segment_mean"`` (ablation baseline): the weighted mean over each segment, then
  the plain mean over segments — an execution compacted into 3 segments counts 3 times.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import Tensor

from sapwood.learner.config import LossAggregation
from sapwood.learner.errors import ConfigError

__all__ = [
    "aggregate",
    "dis_policy_loss",
    "dis_window_bounds",
    "explained_variance",
    "metric_floats",
    "ppo_clip_policy_loss",
    "staleness_metrics",
    "value_loss",
]

_LOG_RATIO_CAP = 20.0  # |log ratio| cap for metrics and PPO (exp overflow guard)


def _weights(mask: Tensor, weight: Tensor | None, dtype: torch.dtype = torch.float32) -> Tensor:
    """[N] weight of each term in ``dtype``: ``weight`` (or 1) on masked entries, 0 elsewhere."""
    m = mask.to(dtype)
    return m if weight is None else weight.to(dtype) * m


def aggregate(
    values: Tensor,
    mask: Tensor,
    *,
    mode: LossAggregation = "token",
    weight: Tensor | None = None,
    segment: Tensor | None = None,
) -> Tensor:
    """Reduce per-token terms to a scalar loss.

    Args:
        values: [N] per-token loss terms.
        mask: [N] bool, the tokens in M.
        mode: ``"token"`` (|M| normalization) or ``"segment_mean"``.
        weight: [N] per-occurrence weight (default 1).
        segment: [N] int64 segment id of each term (any integers); required by ``"segment_mean"``.

    Returns:
        Scalar tensor (0 when M is empty).
    """
    w = _weights(mask, weight, values.dtype)
    contrib = torch.where(w > 0, values * w, torch.zeros_like(values))
    if mode == "token":
        return contrib.sum() / w.sum().clamp(min=1e-8)
    if mode == "segment_mean":
        if segment is None:
            raise ConfigError("segment_mean aggregation needs a segment id per token")
        # torch.unique's output size depends on the data: this mode reads it back (one device sync).
        ids, inv = torch.unique(segment, return_inverse=True)
        k = ids.numel()
        num = torch.zeros(k, dtype=values.dtype, device=values.device).index_add(0, inv, contrib)
        den = torch.zeros(k, dtype=values.dtype, device=values.device).index_add(0, inv, w)
        has = den > 0
        if not bool(has.any()):
            return contrib.sum() * 0.0
        return (num[has] / den[has]).mean()
    raise ConfigError(f"unknown loss aggregation {mode!r}; expected 'token' or 'segment_mean'")


def metric_floats(metrics: Mapping[str, Tensor | float]) -> dict[str, float]:
    """Metrics as Python floats, the tensors read back in one transfer (one device sync).

    Each 0-d tensor becomes the float ``float(t)`` would give; plain numbers pass through.
    """
    tensors = {k: v for k, v in metrics.items() if isinstance(v, Tensor)}
    out = {k: float(v) for k, v in metrics.items() if not isinstance(v, Tensor)}
    if tensors:
        values = torch.stack([v.detach().reshape(()).to(torch.float64) for v in tensors.values()])
        out.update(zip(tensors, values.tolist(), strict=True))
    return {k: out[k] for k in metrics}


def _where0(ok: Tensor, value: Tensor, default: float) -> Tensor:
    """``value`` where the 0-d bool ``ok`` holds, else ``default`` (in ``value``'s dtype), on the device."""
    return torch.where(ok, value, torch.full_like(value, default))


def _wmean(x: Tensor, w: Tensor) -> Tensor:
    """0-d float64 weighted mean ``Σ x w / Σ w`` (0 when ``Σ w`` is not positive); sums in ``x``'s dtype."""
    s = w.sum().double()
    return _where0(s > 0, (x * w).sum().double() / s, 0.0)


def _masked_extreme(x: Tensor, sel: Tensor, *, largest: bool) -> Tensor:
    """0-d max (``largest``) or min of ``x`` over ``sel``; ∓inf when nothing is selected, also for a
    0-element ``x`` (a sentinel element keeps ``amin``/``amax`` defined on an empty batch)."""
    fill = -math.inf if largest else math.inf
    picked = torch.cat([torch.where(sel, x, torch.full_like(x, fill)).reshape(-1), x.new_full((1,), fill)])
    return picked.amax() if largest else picked.amin()


def _ratio_metrics(log_ratio: Tensor, mask: Tensor, w: Tensor) -> dict[str, Tensor]:
    """Ratio statistics over the masked tokens whose log-ratio is a number (NaN ones are left out);
    1 (ratios) and 0 (KL) when there is none."""
    lr = log_ratio.detach().clamp(-_LOG_RATIO_CAP, _LOG_RATIO_CAP)
    sel = mask.to(torch.bool) & ~torch.isnan(lr)
    lr = torch.where(sel, lr, torch.zeros_like(lr))
    ratio = torch.exp(lr)
    w = torch.where(sel, w, torch.zeros_like(w))
    some = sel.any()
    return {
        "policy/ratio_mean": _where0(some, _wmean(ratio, w), 1.0),
        "policy/ratio_min": _where0(some, _masked_extreme(ratio, sel, largest=False), 1.0),
        "policy/ratio_max": _where0(some, _masked_extreme(ratio, sel, largest=True), 1.0),
        # k3 estimator of KL(rollout || current), non-negative per token.
        "policy/approx_kl": _where0(some, _wmean(ratio - 1.0 - lr, w), 0.0),
    }


def dis_window_bounds(
    eps_low: Tensor | float, eps_high: Tensor | float, dtype: torch.dtype, device: torch.device
) -> tuple[Tensor, Tensor]:
    """The DIS window's ratio bounds ``(1 - eps_low, 1 + eps_high)`` in ``dtype`` (computed in float64)."""
    el = torch.as_tensor(eps_low, dtype=torch.float64, device=device)
    eh = torch.as_tensor(eps_high, dtype=torch.float64, device=device)
    return (1.0 - el).to(dtype), (1.0 + eh).to(dtype)


def dis_policy_loss(
    logprob: Tensor,
    rollout_logprob: Tensor,
    advantages: Tensor,
    mask: Tensor,
    eps_low: Tensor | float,
    eps_high: Tensor | float,
    *,
    weight: Tensor | None = None,
    mode: LossAggregation = "token",
    segment: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """DIS policy loss (SAO): ``-f(r) Â`` with ``r = exp(logπ_θ - logπ_rollout)``.

    ``f(x) = x`` if ``1 - eps_low < x < 1 + eps_high`` else 0 (strict: a ratio exactly
    on a bound is dropped): outside the window a token contributes zero loss and zero
    gradient (dropped, not clamped); inside, the surrogate is the exact ratio times
    the advantage. The window test compares the ratio itself with the bounds, both in
    ``logprob``'s dtype. The ratio is exponentiated from the log-ratio clamped to the
    window's log bounds ± 1, so no ratio overflows (a float32 log-ratio above 89 would)
    and a clamped token, being outside the window, gets no gradient.

    A NaN current log-prob (a broken forward pass, a NaN logit) is **dropped**:
    ``f(NaN) = 0``, no loss, no gradient, counted in ``policy/masked_frac`` and in
    ``policy/masked_nan_frac``, so one bad token can neither poison the loss nor hide.

    Args:
        logprob: [N] log π_θ(token | context), differentiable.
        rollout_logprob: [N] log π_rollout logged at sampling time.
        advantages: [N] Â (no gradient).
        mask: [N] bool, trainable tokens.
        eps_low: [N] or scalar lower half-width (per token: per task family).
        eps_high: [N] or scalar upper half-width.
        weight: [N] token / occurrence weight (``aggregate``).
        mode: loss aggregation (``aggregate``).
        segment: [N] segment ids for ``"segment_mean"``.

    Returns:
        ``(loss, metrics)``; metrics ``policy/loss``, ``policy/masked_frac`` (share of
        M outside the window, NaN included), ``policy/masked_low_frac``,
        ``policy/masked_high_frac``, ``policy/masked_nan_frac``,
        ``policy/ratio_mean|min|max``, ``policy/approx_kl``, ``policy/adv_mean``.
    """
    m = mask.to(torch.bool)
    dtype = logprob.dtype
    log_ratio = logprob - rollout_logprob.to(dtype)
    lo, hi = dis_window_bounds(eps_low, eps_high, dtype, logprob.device)
    # Log bounds with a margin: -inf when the window keeps every small ratio (eps_low >= 1).
    log_lo = torch.where(lo > 0, torch.log(lo.clamp(min=torch.finfo(dtype).tiny)) - 1.0, -math.inf)
    log_hi = torch.log(hi) + 1.0
    is_nan = torch.isnan(log_ratio.detach())
    safe = torch.where(is_nan, torch.zeros_like(log_ratio), log_ratio)
    ratio = torch.exp(torch.minimum(torch.maximum(safe, log_lo), log_hi))
    r = ratio.detach()
    below = m & ~is_nan & ~(r > lo)
    above = m & ~is_nan & ~(r < hi)
    inside = m & ~is_nan & ~below & ~above
    adv = advantages.detach().to(dtype)
    per_token = torch.where(inside, -ratio * adv, torch.zeros_like(ratio))
    loss = aggregate(per_token, m, mode=mode, weight=weight, segment=segment)
    w = _weights(m, weight)
    metrics = {
        "policy/loss": loss.detach(),
        "policy/masked_frac": _wmean((~inside & m).to(torch.float32), w),
        "policy/masked_low_frac": _wmean(below.to(torch.float32), w),
        "policy/masked_high_frac": _wmean(above.to(torch.float32), w),
        "policy/masked_nan_frac": _wmean((is_nan & m).to(torch.float32), w),
        "policy/adv_mean": _wmean(adv.detach().float(), w),
        **_ratio_metrics(log_ratio, m, w),
    }
    return loss, metrics


def ppo_clip_policy_loss(
    logprob: Tensor,
    old_logprob: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    weight: Tensor | None = None,
    mode: LossAggregation = "token",
    segment: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clipped surrogate ``-min(r Â, clip(r, 1-clip_low, 1+clip_high) Â)`` (for comparison).

    Args:
        logprob: [N] log π_θ, differentiable.
        old_logprob: [N] log π_old (the rollout log-probs or a recomputation).
        advantages: [N] Â.
        mask: [N] bool, trainable tokens.
        clip_low: lower clip half-width.
        clip_high: upper clip half-width.
        weight: [N] per-occurrence weight.
        mode: loss aggregation.
        segment: [N] segment ids for ``"segment_mean"``.

    Returns:
        ``(loss, metrics)``; metrics ``policy/loss``, ``policy/clip_frac``,
        ``policy/ratio_mean|min|max``, ``policy/approx_kl``, ``policy/adv_mean``.
    """
    m = mask.to(torch.bool)
    log_ratio = (logprob - old_logprob.to(logprob.dtype)).clamp(-_LOG_RATIO_CAP, _LOG_RATIO_CAP)
    ratio = torch.exp(log_ratio)
    adv = advantages.detach().to(logprob.dtype)
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(unclipped, clipped)
    loss = aggregate(per_token, m, mode=mode, weight=weight, segment=segment)
    w = _weights(m, weight)
    metrics = {
        "policy/loss": loss.detach(),
        "policy/clip_frac": _wmean((clipped > unclipped).detach().to(torch.float32), w),
        "policy/adv_mean": _wmean(adv.detach().float(), w),
        **_ratio_metrics(log_ratio, m, w),
    }
    return loss, metrics


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor, weight: Tensor | None = None) -> Tensor:
    """``1 - Var(returns - values) / Var(returns)`` over the masked tokens (weighted), a 0-d float64 tensor.

    NaN when the returns have no variance (no signal either way) or no token is masked.
    """
    w = _weights(mask, weight, torch.float64)
    s = w.sum()
    r, v = returns.detach().double(), values.detach().double()
    mean_r = (r * w).sum() / s
    var_r = ((r - mean_r) ** 2 * w).sum() / s
    err = r - v
    mean_e = (err * w).sum() / s
    var_e = ((err - mean_e) ** 2 * w).sum() / s
    return _where0((s > 0) & (var_r >= 1e-12), 1.0 - var_e / var_r, math.nan)


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    *,
    clip: float | None = 0.2,
    weight: Tensor | None = None,
    mode: LossAggregation = "token",
    segment: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Token-level clipped value loss ``0.5 max((V - G)^2, (clip(V, V_old ± clip) - G)^2)``.

    Args:
        values: [N] V_θ, differentiable.
        old_values: [N] values when the targets were computed.
        returns: [N] targets G (local λ-returns).
        mask: [N] bool, tokens whose state values are trained (the trainable tokens).
        clip: value clip half-width; ``None`` for the plain squared error.
        weight: [N] per-occurrence weight.
        mode: loss aggregation.
        segment: [N] segment ids for ``"segment_mean"``.

    Returns:
        ``(loss, metrics)``; metrics ``critic/value_loss``, ``critic/clip_frac``,
        ``critic/explained_var``, ``critic/value_mean``, ``critic/return_mean``.
    """
    m = mask.to(torch.bool)
    g = returns.detach().to(values.dtype)
    err = (values - g) ** 2
    if clip is None:
        per_token = 0.5 * err
        clipped_more = torch.zeros_like(m)
    else:
        old = old_values.detach().to(values.dtype)
        v_clip = old + (values - old).clamp(-clip, clip)
        err_clip = (v_clip - g) ** 2
        per_token = 0.5 * torch.maximum(err, err_clip)
        clipped_more = (err_clip > err).detach()
    loss = aggregate(per_token, m, mode=mode, weight=weight, segment=segment)
    w = _weights(m, weight)
    metrics = {
        "critic/value_loss": loss.detach(),
        "critic/clip_frac": _wmean(clipped_more.to(torch.float32), w),
        "critic/explained_var": explained_variance(values, g, m, weight),
        "critic/value_mean": _wmean(values.detach().float(), w),
        "critic/return_mean": _wmean(g.detach().float(), w),
    }
    return loss, metrics


def staleness_metrics(
    policy_version: Tensor, mask: Tensor, current_version: int, weight: Tensor | None = None
) -> dict[str, Tensor]:
    """Policy lag of the trained tokens: ``current_version - policy_version``.

    Args:
        policy_version: [N] int64 version that generated each token.
        mask: [N] bool, trainable tokens.
        current_version: version of the weights being updated.
        weight: [N] per-occurrence weight.

    Returns:
        ``policy/staleness_mean`` and ``policy/staleness_max`` (0 when M is empty).
    """
    m = mask.to(torch.bool)
    lag = (current_version - policy_version).to(torch.float32)
    w = _weights(m, weight)
    return {
        "policy/staleness_mean": _wmean(lag, w),
        "policy/staleness_max": _where0(m.any(), _masked_extreme(lag, m, largest=True), 0.0),
    }
