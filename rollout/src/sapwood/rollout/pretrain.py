"""Brief supervised pre-training on imperfect demonstrations (the "SFT" start of RL).

Real RL for agents starts from a supervised checkpoint; here the demonstrator is scripted
(:func:`~sapwood.rollout.tasks.teacher_action`, :func:`~sapwood.rollout.tasks.teacher_summary`)
and deliberately imperfect (:class:`~sapwood.rollout.tasks.DemoNoise`), and training is short,
so the pre-trained policy is clearly better than random yet leaves room for RL.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from sapwood.learner.model import TinyActorCritic
from sapwood.rollout.tasks import DemoNoise, KeyRecallEnv, teacher_action, teacher_summary

__all__ = ["PretrainConfig", "PretrainResult", "demonstration", "pack_sequences", "pretrain"]


@dataclass(frozen=True)
class PretrainConfig:
    """Supervised warm start."""

    steps: int = 300
    """Optimizer steps."""
    batch_size: int = 16
    """Demonstration executions per step."""
    lr: float = 1e-2
    """Peak AdamW learning rate (linear warm-up over 20 steps, then linear decay to 10 %)."""
    noise: DemoNoise = field(default_factory=DemoNoise)
    """How imperfect the demonstrations are (at the end of pre-training)."""
    clean_fraction: float = 0.7
    """The first ``clean_fraction`` of the steps use perfect demonstrations, the rest ``noise``:
    the copying mechanism forms quickly on clean data, and the policy ends up imitating the
    imperfect demonstrator (the room RL has to improve)."""
    pack_tokens: int = 512
    """Most tokens per packed forward (the block-diagonal mask is quadratic in this)."""
    seed: int = 0


@dataclass
class PretrainResult:
    losses: list[float]
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


def pretrain(
    model: TinyActorCritic,
    env: KeyRecallEnv,
    config: PretrainConfig | None = None,
    *,
    on_step: Callable[[int, float], None] | None = None,
) -> PretrainResult:
    """Train ``model``'s actor (trunk + LM head) by next-token cross-entropy on demonstrated outputs.

    ``on_step(step, loss)`` is called after every optimizer step.
    """
    cfg = config or PretrainConfig()
    rng = np.random.default_rng(cfg.seed)
    params = model.actor_parameters()
    opt = torch.optim.AdamW(params, lr=cfg.lr)
    losses: list[float] = []
    n_tokens = 0
    t0 = time.perf_counter()
    model.train()
    for step in range(cfg.steps):
        noise = cfg.noise if step >= cfg.clean_fraction * cfg.steps else _CLEAN
        seqs = [s for _ in range(cfg.batch_size) for s in demonstration(env, noise, rng)]
        lr = cfg.lr * min(1.0, (step + 1) / 20) * (0.1 + 0.9 * (1 - step / cfg.steps))
        for group in opt.param_groups:
            group["lr"] = lr
        opt.zero_grad(set_to_none=True)
        packs = _split(seqs, cfg.pack_tokens)
        n_sup = sum(sum(m[1:]) for _, m in seqs)
        total = 0.0
        for pack in packs:
            tokens, position, attn, target, loss_mask = pack_sequences(pack)
            n_tokens += int(tokens.numel())
            logits = model.lm_head(model.actor(tokens, position, attn))
            loss = torch.nn.functional.cross_entropy(logits[loss_mask], target[loss_mask], reduction="sum") / n_sup
            loss.backward()
            total += float(loss.detach())
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        losses.append(total)
        if on_step is not None:
            on_step(step, total)
    model.eval()
    return PretrainResult(losses=losses, seconds=time.perf_counter() - t0, tokens=n_tokens)
