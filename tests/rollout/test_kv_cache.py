"""Incremental decoding with a KV cache equals the full recompute, step by step, up to ``max_position``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sapwood.learner.errors import ConfigError
from sapwood.learner.model import TinyActorCritic, TinyTransformerConfig
from sapwood.rollout.engines import EngineError, SamplingParams
from sapwood.rollout.torch_engine import LocalTorchEngine, kv_cache_bytes

CFG = TinyTransformerConfig(vocab_size=64, d_model=32, n_heads=4, n_layers=2, d_ff=64, max_position=24)


@pytest.fixture
def model() -> TinyActorCritic:
    torch.manual_seed(0)
    return TinyActorCritic(CFG).eval()


def full_logits(model: TinyActorCritic, ids: list[int]) -> torch.Tensor:
    """[V] next-token logits of a full causal forward over ``ids``."""
    n = len(ids)
    h = model.actor(torch.tensor(ids), torch.arange(n), torch.ones(n, n, dtype=torch.bool).tril())
    out: torch.Tensor = model.lm_head(h[-1])
    return out


def test_cached_logits_equal_the_full_forward_at_every_step_up_to_max_position(model: TinyActorCritic) -> None:
    rng = np.random.default_rng(0)
    ids = rng.integers(0, CFG.vocab_size, CFG.max_position).tolist()
    prompt = 5
    with torch.inference_mode():
        logits, past = model.actor_step(torch.tensor(ids[:prompt]))
        torch.testing.assert_close(logits[-1], full_logits(model, ids[:prompt]), atol=1e-5, rtol=1e-5)
        for n in range(prompt, CFG.max_position):  # the last step fills position max_position - 1
            logits, past = model.actor_step(torch.tensor([ids[n]]), past)
            torch.testing.assert_close(logits[-1], full_logits(model, ids[: n + 1]), atol=1e-5, rtol=1e-5)
        assert len(past) == CFG.n_layers
        assert past[0][0].shape == (CFG.n_heads, CFG.max_position, CFG.d_model // CFG.n_heads)
        assert kv_cache_bytes(past) == CFG.n_layers * 2 * CFG.max_position * CFG.d_model * 4
        with pytest.raises(ConfigError, match="max_position 24"):
            model.actor_step(torch.tensor([1]), past)


def test_a_multi_token_extension_equals_the_full_forward_at_each_new_position(model: TinyActorCritic) -> None:
    ids = list(range(1, 13))
    with torch.inference_mode():
        _, past = model.actor_step(torch.tensor(ids[:4]))
        logits, _ = model.actor_step(torch.tensor(ids[4:]), past)
        for j in range(4, 12):
            torch.testing.assert_close(logits[j - 4], full_logits(model, ids[: j + 1]), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("temperature", "top_p", "mode"), [(1.0, 1.0, "sampling"), (0.8, 0.9, "model")])
def test_cached_and_full_recompute_engines_sample_the_same_tokens_with_the_same_seed(
        model: TinyActorCritic, temperature: float, top_p: float, mode: str) -> None:
    prompt = [3, 1, 4, 1, 5]
    sp = SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=CFG.max_position - len(prompt))
    cached = LocalTorchEngine(CFG, state=model.state_dict(), seed=7, logprobs=mode)  # type: ignore[arg-type]
    full = LocalTorchEngine(CFG, state=model.state_dict(), seed=7, logprobs=mode,  # type: ignore[arg-type]
                            kv_cache=False)
    a = cached.generate(prompt, sp)
    b = full.generate(prompt, sp)
    assert a.output_ids.size == CFG.max_position - len(prompt), "input + new tokens exactly max_position"
    assert a.output_ids.tolist() == b.output_ids.tolist()
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)


def test_one_token_over_max_position_is_a_clear_error(model: TinyActorCritic) -> None:
    engine = LocalTorchEngine(CFG, state=model.state_dict())
    with pytest.raises(EngineError, match="5 input \\+ 20 new tokens exceed the model's max_position 24"):
        engine.generate([1, 2, 3, 4, 5], SamplingParams(max_new_tokens=CFG.max_position - 4))


def test_extend_refuses_no_tokens(model: TinyActorCritic) -> None:
    engine = LocalTorchEngine(CFG, state=model.state_dict())
    with pytest.raises(EngineError, match="at least one new token"), torch.inference_mode():
        engine.extend([])
