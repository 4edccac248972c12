"""The training chaos campaign's evaluation reward: the softmax-weighted expected reward (boundaries), and the
packed log-likelihood forward against one sequence at a time."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from sapwood.demo.chaos.evaluation import (
    ANSWER_TOKENS,
    PROMPT_TOKENS,
    answer_log_likelihood,
    eval_set,
    evaluation_reward,
    expected_reward,
)
from sapwood.learner.model import TinyActorCritic, TinyTransformerConfig


def test_expected_reward_weights_rewards_by_the_softmax_of_the_log_likelihoods() -> None:
    r = np.array([1.0, 0.0, 1.0])
    assert expected_reward(np.zeros(3), r) == pytest.approx(2 / 3)  # indifferent policy: the mean reward
    assert expected_reward(np.array([0.0, math.log(2.0), 0.0]), r) == pytest.approx(0.5)
    # far apart and huge (no overflow): all weight on the likeliest
    assert expected_reward(np.array([-1e6, 1e6, -1e6]), r) == 0.0
    assert expected_reward(np.array([1e300, -1e300, 1e300]), r) == 1.0
    assert math.isnan(expected_reward(np.array([]), np.array([])))
    with pytest.raises(ValueError, match="finite"):
        expected_reward(np.array([0.0, float("nan")]), np.array([1.0, 0.0]))
    with pytest.raises(ValueError, match="finite"):
        expected_reward(np.array([0.0, float("inf")]), np.array([1.0, 0.0]))


def test_packed_log_likelihood_equals_one_sequence_at_a_time() -> None:
    torch.manual_seed(0)
    model = TinyActorCritic(TinyTransformerConfig(vocab_size=500, d_model=16, n_heads=2, n_layers=1, d_ff=32))
    model.eval()
    es = eval_set([f"{i}:0:{s}" for i in range(35) for s in range(2)])  # 70 samples: two full chunks + a rest
    packed = answer_log_likelihood(model, es)
    assert packed.shape == (70,)
    with torch.no_grad():
        for k in (0, 31, 32, 69):
            seq = torch.from_numpy(np.concatenate([es.prompts[k], es.answers[k]]))
            n = seq.numel()
            logits, _ = model(seq, torch.arange(n), torch.tril(torch.ones(n, n, dtype=torch.bool)))
            logp = torch.log_softmax(logits, -1)
            want = sum(float(logp[PROMPT_TOKENS - 1 + j, seq[PROMPT_TOKENS + j]]) for j in range(ANSWER_TOKENS))
            assert packed[k] == pytest.approx(want, abs=1e-4)


def test_eval_set_is_what_the_synthetic_worker_records() -> None:
    from sapwood.rollout.prompt_worker import tokens

    es = eval_set(["3:0:1"])
    assert es.prompts.shape == (1, PROMPT_TOKENS)
    assert es.answers.shape == (1, ANSWER_TOKENS)
    assert list(es.prompts[0]) == list(tokens("3:0:1", -1, PROMPT_TOKENS))
    assert list(es.answers[0]) == list(tokens("3:0:1", 0, ANSWER_TOKENS))
    assert es.rewards[0] == float(tokens("3:0:1", 99, 1)[0] % 2)


def test_evaluation_reward_of_a_checkpoint_and_of_a_policy_preferring_rewarded_answers(tmp_path) -> None:  # type: ignore[no-untyped-def]
    es = eval_set([f"{i}:0:0" for i in range(40)])
    torch.manual_seed(1)
    model = TinyActorCritic(TinyTransformerConfig(vocab_size=500))
    path = tmp_path / "ck.pt"
    torch.save({"backend": {"model": model.state_dict()}}, path)  # the learner checkpoint's layout
    untrained = evaluation_reward(str(path), es)
    assert untrained.reward == pytest.approx(float(es.rewards.mean()), abs=0.05)  # indifferent: about the mean
    assert untrained.stderr > 0
    # an LM head biased toward the first token of each rewarded answer (and no rejected one's)
    preferred = {int(a[0]) for a, r in zip(es.answers, es.rewards, strict=True) if r == 1.0}
    preferred -= {int(a[0]) for a, r in zip(es.answers, es.rewards, strict=True) if r == 0.0}
    assert preferred
    head = torch.nn.Linear(model.lm_head.in_features, 500, bias=True)
    with torch.no_grad():
        head.weight.copy_(model.lm_head.weight)
        head.bias.zero_()
        head.bias[sorted(preferred)] = 5.0
    model.lm_head = head
    assert expected_reward(answer_log_likelihood(model, es), es.rewards) > untrained.reward + 0.2
