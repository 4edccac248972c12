"""The local torch engine agrees with the learner: logged log-probs equal ``tree_forward``'s π_θ."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from sapwood.learner.batch import ACTION, PROMPT, TreeBatchBuilder
from sapwood.learner.loop import latest_policy
from sapwood.learner.model import TinyActorCritic, TinyTransformerConfig, tree_forward
from sapwood.platform.errors import ValidationError
from sapwood.platform.events import PolicyPublished
from sapwood.platform.store import Store
from sapwood.rollout.engines import EngineError, SamplingParams, load_model_state
from sapwood.rollout.torch_engine import LocalTorchEngine

CFG = TinyTransformerConfig(vocab_size=64, d_model=32, n_heads=4, n_layers=2, d_ff=64, max_position=64)


@pytest.fixture
def model() -> TinyActorCritic:
    torch.manual_seed(0)
    return TinyActorCritic(CFG).eval()


# -- local engine ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("temperature", "top_p", "mode"), [(1.0, 1.0, "sampling"), (0.7, 0.9, "model")])
def test_local_engine_logprobs_equal_learner_tree_forward(model: TinyActorCritic, temperature: float, top_p: float,
                                                          mode: str) -> None:
    engine = LocalTorchEngine(CFG, state=model.state_dict(), seed=3, logprobs=mode)  # type: ignore[arg-type]
    prompt = [1, 2, 3, 20, 21, 22, 4]
    gen = engine.generate(prompt, SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=12))
    assert gen.output_ids.dtype == np.int32
    assert gen.logprobs.dtype == np.float32
    assert gen.output_ids.size == gen.logprobs.size == 12
    assert gen.finish_reason == "length"
    b = TreeBatchBuilder()
    e = b.add_execution("x")
    end = b.add_run(e, -1, prompt, PROMPT)
    b.add_run(e, end, gen.output_ids.tolist(), ACTION, logprobs=gen.logprobs.tolist(), reward=0.0)
    batch = b.build()
    with torch.no_grad():
        out = tree_forward(model, batch)
    learner_lp = out.logprob[len(prompt):].numpy()
    torch.testing.assert_close(torch.from_numpy(learner_lp), torch.from_numpy(gen.logprobs), atol=1e-5, rtol=1e-5)


def test_stop_tokens_and_top_p(model: TinyActorCritic) -> None:
    engine = LocalTorchEngine(CFG, state=model.state_dict(), seed=0)
    with torch.no_grad():
        logits = engine.next_token_logits(torch.tensor([1, 2, 3]))
    probs = torch.softmax(logits, -1)
    top = int(probs.argmax())
    gen = engine.generate([1, 2, 3], SamplingParams(max_new_tokens=5, stop_token_ids=(top,), top_p=1e-6))
    # top-p that keeps one token is greedy; the stop token ends the call and is part of the output
    assert gen.output_ids.tolist() == [top]
    assert gen.finish_reason == "stop"
    assert gen.logprobs[0] == pytest.approx(0.0, abs=1e-6)  # the sampled distribution had one token


def test_engine_rejects_bad_requests(model: TinyActorCritic) -> None:
    engine = LocalTorchEngine(CFG, state=model.state_dict())
    with pytest.raises(ValidationError):
        engine.generate([], SamplingParams())
    with pytest.raises(EngineError, match="max_position"):
        engine.generate([1] * 60, SamplingParams(max_new_tokens=8))
    with pytest.raises(ValidationError):
        SamplingParams(temperature=0.0)
    with pytest.raises(ValidationError):
        SamplingParams(top_p=1.5)


def test_local_engine_serves_the_newest_published_version(tmp_path: Path, model: TinyActorCritic) -> None:
    store = Store.open(f"sqlite:///{tmp_path / 's.db'}")
    engine = LocalTorchEngine(CFG, state=model.state_dict(), latest=lambda: latest_policy(store, "run"), seed=0)
    params = SamplingParams(max_new_tokens=3)
    assert engine.generate([1, 2], params).policy_version == 0
    torch.manual_seed(5)
    newer = TinyActorCritic(CFG)
    path = tmp_path / "policy-v000003.pt"
    torch.save({"model": newer.state_dict(), "actor_opt": {}, "policy_version": 3}, path)
    store.apply([PolicyPublished(run_id="run", version=3, checkpoint=str(path))])
    gen = engine.generate([1, 2], params)
    assert gen.policy_version == 3
    assert engine.loads == 1
    for name, value in newer.state_dict().items():
        torch.testing.assert_close(engine.model.state_dict()[name], value)
    store.apply([PolicyPublished(run_id="run", version=2, checkpoint=str(path))])  # older: ignored
    assert engine.generate([1, 2], params).policy_version == 3
    assert engine.loads == 1
    assert set(load_model_state(path)) == set(newer.state_dict())
