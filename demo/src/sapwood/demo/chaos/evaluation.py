"""Evaluation reward of a training-chaos checkpoint, a policy-dependent figure to compare two runs by.

The campaign's rollout workers are synthetic (``sapwood.rollout.prompt_worker``): a sample's first model
call answers the prompt ``tokens(s, -1, 8)`` with ``tokens(s, 0, 4)`` and the sample's reward ``r_s`` is
0 or 1, all fixed by the sample id. The evaluation asks the policy to choose among the evaluation samples'
answers by its own likelihood: with ``ℓ_s = log π(answer_s | prompt_s)`` (summed over the 4 answer
tokens, nats), the evaluation reward is the expected reward of that choice,

    R = Σ_s r_s · softmax(ℓ)_s,

so an untrained policy scores about the mean reward and one that learned to prefer rewarded answers
scores more. Its noise (:func:`evaluation_reward`'s ``stderr``) is the bootstrap standard error over the
evaluation samples.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from sapwood.learner.model import TinyActorCritic, TinyTransformerConfig
from sapwood.rollout.engines import load_model_state
from sapwood.rollout.prompt_worker import tokens

__all__ = ["EvalSet", "Evaluation", "eval_set", "evaluation_reward", "expected_reward"]

PROMPT_TOKENS = 8
ANSWER_TOKENS = 4


@dataclass(frozen=True)
class EvalSet:
    """``prompts`` [N, 8] and ``answers`` [N, 4] int64 token ids, ``rewards`` [N] float64 (0 or 1)."""

    prompts: np.ndarray
    answers: np.ndarray
    rewards: np.ndarray


@dataclass(frozen=True)
class Evaluation:
    """One checkpoint's evaluation reward and its bootstrap standard error."""

    reward: float
    stderr: float


def eval_set(sample_ids: Sequence[str]) -> EvalSet:
    """The first model call and the reward of each sample, as the synthetic worker records them."""
    prompts = np.stack([tokens(s, -1, PROMPT_TOKENS) for s in sample_ids]).astype(np.int64)
    answers = np.stack([tokens(s, 0, ANSWER_TOKENS) for s in sample_ids]).astype(np.int64)
    rewards = np.array([float(tokens(s, 99, 1)[0] % 2) for s in sample_ids], dtype=np.float64)
    return EvalSet(prompts, answers, rewards)


def expected_reward(log_likelihood: np.ndarray, rewards: np.ndarray) -> float:
    """``Σ r · softmax(ℓ)`` over samples; ``log_likelihood`` and ``rewards`` are [N]. NaN for N = 0."""
    if log_likelihood.size == 0:
        return float("nan")
    if not np.all(np.isfinite(log_likelihood)):
        raise ValueError("log-likelihoods must be finite")
    w = np.exp(log_likelihood - log_likelihood.max())
    return float(np.dot(w, rewards) / w.sum())


def answer_log_likelihood(model: TinyActorCritic, es: EvalSet) -> np.ndarray:
    """``log π(answer | prompt)`` per sample, [N] nats: each row a causal sequence of 8 + 4 tokens."""
    seq = torch.from_numpy(np.concatenate([es.prompts, es.answers], axis=1))  # [N, 12]
    n, t = seq.shape
    out = np.empty(n, dtype=np.float64)
    chunk = 32  # sequences packed per forward: a [32·12, 32·12] block-diagonal causal mask
    with torch.no_grad():
        for lo in range(0, n, chunk):
            block = seq[lo:lo + chunk]
            m = block.shape[0]
            flat = block.reshape(-1)
            position = torch.arange(t).repeat(m)
            row = torch.arange(m).repeat_interleave(t)
            mask = (row[:, None] == row[None, :]) & (position[:, None] >= position[None, :])
            logits, _ = model(flat, position, mask)
            logp = torch.log_softmax(logits.view(m, t, -1), dim=-1)
            # the token at position p+1 is predicted by the logits at p
            pred = logp[:, PROMPT_TOKENS - 1:t - 1, :]
            target = block[:, PROMPT_TOKENS:]
            out[lo:lo + m] = pred.gather(-1, target[..., None]).squeeze(-1).sum(-1).double().numpy()
    return out


def evaluation_reward(checkpoint: str, es: EvalSet, *, vocab_size: int = 500, bootstrap: int = 200,
                      seed: int = 0) -> Evaluation:
    """Evaluation reward of the learner checkpoint at ``checkpoint`` (a ``sapwood learn`` TinyActorCritic)."""
    model = TinyActorCritic(TinyTransformerConfig(vocab_size=vocab_size))
    model.load_state_dict(load_model_state(checkpoint))
    model.eval()
    ll = answer_log_likelihood(model, es)
    rng = np.random.default_rng(seed)
    n = ll.size
    draws = [expected_reward(ll[idx], es.rewards[idx]) for idx in (rng.integers(0, n, n) for _ in range(bootstrap))]
    return Evaluation(expected_reward(ll, es.rewards), float(np.std(draws)) if n else float("nan"))
