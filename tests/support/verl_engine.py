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


class VllmServerManager:
    """verl's server-manager interface over a real vLLM server (``/v1/completions`` with token-id prompts):
    the answer's exact output ids and per-token log-probs, as verl's own vLLM replica returns them."""

    def __init__(self, url: str, model: str = "tiny", max_tokens: int = 3) -> None:
        self.url, self.model, self.max_tokens = url.rstrip("/"), model, max_tokens
        self.answers: list[tuple[list[int], list[int], list[float]]] = []

    async def generate(self, *, request_id: str, prompt_ids: list[int], sampling_params: dict[str, Any],
                       **kwargs: Any) -> TokenOutput:
        import httpx

        body = {"model": self.model, "prompt": list(prompt_ids), "max_tokens": self.max_tokens, "logprobs": 0,
                "return_token_ids": True, "temperature": float(sampling_params.get("temperature", 1.0)),
                "ignore_eos": True}
        async with httpx.AsyncClient(timeout=120) as client:
            answer = (await client.post(f"{self.url}/v1/completions", json=body)).raise_for_status().json()
        choice = answer["choices"][0]
        if choice.get("prompt_token_ids") not in (None, list(prompt_ids)):
            raise AssertionError(f"vLLM generated from {choice['prompt_token_ids']}, not the ids sent")
        out = [int(t) for t in choice["token_ids"]]
        lps = [float(lp) for lp in choice["logprobs"]["token_logprobs"]]
        self.answers.append((list(prompt_ids), out, lps))
        return TokenOutput(token_ids=out, log_probs=lps, stop_reason="completed")
