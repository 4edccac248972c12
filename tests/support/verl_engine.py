"""verl's server-manager interface over Sapwood's local engine, for the verl suite (imports verl: only the
suite, run in verl's own venv, imports this module)."""

from __future__ import annotations

from typing import Any

from verl.workers.rollout.replica import TokenOutput

from sapwood.learner.model import TinyTransformerConfig
from sapwood.rollout.engines import SamplingParams
from sapwood.rollout.torch_engine import LocalTorchEngine
from tests.support.verl_trees import TOKENIZER_VOCAB as VOCAB


class EngineServerManager:
    """verl's server-manager interface over Sapwood's local engine (a tiny actor-critic on the CPU)."""

    def __init__(self) -> None:
        self.engine = LocalTorchEngine(TinyTransformerConfig(vocab_size=VOCAB, d_model=16, n_heads=2, n_layers=1,
                                                             d_ff=32, max_position=96))
        self.answers: list[tuple[list[int], list[int], list[float]]] = []

    async def generate(self, *, request_id: str, prompt_ids: list[int], sampling_params: dict[str, Any],
                       **kwargs: Any) -> TokenOutput:
        gen = self.engine.generate(prompt_ids, SamplingParams(max_new_tokens=3))
        out, lps = gen.output_ids.tolist(), gen.logprobs.tolist()
        self.answers.append((list(prompt_ids), out, lps))
        return TokenOutput(token_ids=out, log_probs=lps, stop_reason="completed")
