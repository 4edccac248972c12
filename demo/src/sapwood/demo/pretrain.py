"""Brief supervised pre-training on imperfect demonstrations (the "SFT" start of RL).

Real RL for agents starts from a supervised checkpoint; here the demonstrator is scripted
(:func:`~sapwood.demo.tasks.teacher_action`, :func:`~sapwood.demo.tasks.teacher_summary`)
and deliberately imperfect (:class:`~sapwood.demo.tasks.DemoNoise`), and training is short,
so the pre-trained policy is clearly better than random yet leaves room for RL.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from sapwood.demo.tasks import DemoNoise, KeyRecallEnv, teacher_action, teacher_summary
from sapwood.learner.model import TinyActorCritic
from sapwood.platform.errors import ValidationError

__all__ = ["PretrainConfig", "PretrainResult", "demonstration", "pack_sequences", "pretrain"]


@dataclass(frozen=True)
class PretrainConfig:
    """Supervised warm start in two phases: clean demonstrations until the copy mechanism has
    formed, then a fixed number of steps on imperfect ones (the policy ends up imitating an
    imperfect demonstrator: the room RL has to improve).

    Small transformers learn the copy only after a plateau whose length depends on the seed
    (here 130–260 steps at the default learning rate), so the clean phase runs until the loss says it is over, not for a
    fixed number of steps.
    """

    max_clean_steps: int = 700
    """Cap of the clean phase (if the loss never gets there, pre-training goes on anyway)."""
    min_clean_steps: int = 60
    """The clean phase lasts at least this long."""
    clean_loss_target: float = 0.4
    """The clean phase ends when the running mean of its loss falls below this (the copy of
    actions and of summaries has formed; the plateau sits at ≈ ln(16) ≈ 2.77)."""
    noisy_steps: int = 90
    """Steps on imperfect demonstrations after the clean phase."""
    batch_size: int = 16
    """Demonstration executions per step."""
    lr: float = 5e-3
    """AdamW learning rate of the clean phase (after a 20-step linear warm-up); at 1e-2 the plateau
    outlasted 700 steps for one seed in five, at 5e-3 it ended within 130–260 for seeds 0–4."""
    noisy_lr: tuple[float, float] = (4e-3, 1e-3)
    """Learning rate of the noisy phase, decaying linearly from the first value to the second."""
    noise: DemoNoise = field(default_factory=DemoNoise)
    """How imperfect the demonstrations of the noisy phase are."""
    pack_tokens: int = 512
    """Most tokens per packed forward (the block-diagonal mask is quadratic in this)."""
    seed: int = 0
    """Seeds the demonstrations."""

    def __post_init__(self) -> None:
        if self.max_clean_steps < self.min_clean_steps or self.min_clean_steps < 0 or self.noisy_steps < 0:
            raise ValidationError("need 0 ≤ min_clean_steps ≤ max_clean_steps and noisy_steps ≥ 0")


@dataclass
class PretrainResult:
    """What pre-training did."""

    losses: list[float]
    """Loss of every step (clean steps first)."""
    clean_steps: int
    """Steps of the clean phase."""
    converged: bool
    """The clean phase reached ``clean_loss_target`` (False: the copy mechanism may not have formed)."""
    seconds: float
    tokens: int


def demonstration(env: KeyRecallEnv, noise: DemoNoise, rng: np.random.Generator) -> list[tuple[list[int], list[bool]]]:
    """One demonstrated execution as per-segment sequences ``(tokens, is_model_output)``.

    Each sequence is a whole segment context (prompt, actions, observations, the summary
    request and the summary) — the input of every call in it is a prefix of it.
    """
    task = env.sample_task(rng)
    state = env.reset(task)
    seqs: list[tuple[list[int], list[bool]]] = []
    tokens = list(state.context)
    mask = [False] * len(tokens)
    while not env.finished(state):
        if env.needs_summary(state):
            summary = teacher_summary(env, state, noise, rng)
            tokens += [*env.summary_input(state)[len(tokens):], *summary]
            mask += [False] * (len(tokens) - len(mask) - len(summary)) + [True] * len(summary)
            seqs.append((tokens, mask))
            env.compact(state, summary)
            tokens, mask = list(state.context), [False] * len(state.context)
            continue
        action = teacher_action(env, state, noise, rng)
        obs = env.act(state, [action], rng)
        tokens += [action, *obs]
        mask += [True] + [False] * len(obs)
    seqs.append((tokens, mask))
    return seqs


def pack_sequences(seqs: list[tuple[list[int], list[bool]]]) -> tuple[torch.Tensor, ...]:
    """Pack sequences into one token row with a block-diagonal causal mask.

    Returns:
        ``(tokens [T], position [T], attn_mask [T, T] bool, target [T], loss_mask [T] bool)`` where
        ``target[i]`` is the token after ``i`` in its sequence and ``loss_mask[i]`` says that this
        next token is a model output (the supervised set).
    """
    toks: list[int] = []
    pos: list[int] = []
    tgt: list[int] = []
    lm: list[bool] = []
    seg: list[int] = []
    for k, (t, m) in enumerate(seqs):
        toks += t
        pos += range(len(t))
        tgt += [*t[1:], 0]
        lm += [*m[1:], False]
        seg += [k] * len(t)
    s = torch.tensor(seg)
    p = torch.tensor(pos)
    attn = (s[:, None] == s[None, :]) & (p[None, :] <= p[:, None])
    return torch.tensor(toks), p, attn, torch.tensor(tgt), torch.tensor(lm)


_CLEAN = DemoNoise(wrong_action=0.0, invalid_action=0.0, summary_substitute=0.0, summary_truncate=0.0)


def _split(seqs: list[tuple[list[int], list[bool]]], limit: int) -> list[list[tuple[list[int], list[bool]]]]:
    packs: list[list[tuple[list[int], list[bool]]]] = [[]]
    size = 0
    for seq in seqs:
        if packs[-1] and size + len(seq[0]) > limit:
            packs.append([])
            size = 0
        packs[-1].append(seq)
        size += len(seq[0])
    return packs


def _step(model: TinyActorCritic, opt: torch.optim.Optimizer, params: list[torch.nn.Parameter],
          seqs: list[tuple[list[int], list[bool]]], lr: float, pack_tokens: int) -> tuple[float, int]:
    """One optimizer step on ``seqs``; returns (mean loss per supervised token, tokens processed)."""
    for group in opt.param_groups:
        group["lr"] = lr
    opt.zero_grad(set_to_none=True)
    n_sup = max(1, sum(sum(m[1:]) for _, m in seqs))
    total = 0.0
    n_tokens = 0
    for pack in _split(seqs, pack_tokens):
        tokens, position, attn, target, loss_mask = pack_sequences(pack)
        n_tokens += int(tokens.numel())
        logits = model.lm_head(model.actor(tokens, position, attn))
        loss = torch.nn.functional.cross_entropy(logits[loss_mask], target[loss_mask], reduction="sum") / n_sup
        loss.backward()
        total += float(loss.detach())
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    return total, n_tokens


def pretrain(
    model: TinyActorCritic,
    env: KeyRecallEnv,
    config: PretrainConfig | None = None,
    *,
    on_step: Callable[[int, float, int], None] | None = None,
) -> PretrainResult:
    """Train ``model``'s actor (trunk + LM head) by next-token cross-entropy on demonstrated outputs.

    ``on_step(step, loss, planned)`` is called after every optimizer step; ``planned`` is the
    number of steps expected in all (it shrinks when the clean phase ends early).
    """
    cfg = config or PretrainConfig()
    rng = np.random.default_rng(cfg.seed)
    params = model.actor_parameters()
    opt = torch.optim.AdamW(params, lr=cfg.lr)
    losses: list[float] = []
    n_tokens = 0
    t0 = time.perf_counter()
    model.train()
    ema: float | None = None
    converged = False
    clean_steps = 0
    while clean_steps < cfg.max_clean_steps:
        seqs = [s for _ in range(cfg.batch_size) for s in demonstration(env, _CLEAN, rng)]
        loss, n = _step(model, opt, params, seqs, cfg.lr * min(1.0, (clean_steps + 1) / 20), cfg.pack_tokens)
        n_tokens += n
        losses.append(loss)
        clean_steps += 1
        if on_step is not None:
            on_step(len(losses) - 1, loss, cfg.max_clean_steps + cfg.noisy_steps)
        ema = loss if ema is None else 0.9 * ema + 0.1 * loss
        if clean_steps >= cfg.min_clean_steps and ema < cfg.clean_loss_target:
            converged = True
            break
    hi, lo = cfg.noisy_lr
    for k in range(cfg.noisy_steps):
        seqs = [s for _ in range(cfg.batch_size) for s in demonstration(env, cfg.noise, rng)]
        lr = hi + (lo - hi) * k / max(1, cfg.noisy_steps - 1)
        loss, n = _step(model, opt, params, seqs, lr, cfg.pack_tokens)
        n_tokens += n
        losses.append(loss)
        if on_step is not None:
            on_step(len(losses) - 1, loss, clean_steps + cfg.noisy_steps)
    model.eval()
    return PretrainResult(losses=losses, clean_steps=clean_steps, converged=converged,
                          seconds=time.perf_counter() - t0, tokens=n_tokens)
