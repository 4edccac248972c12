"""What the gateway relies on from a real vLLM server: token ids and logprobs in its answers."""

from __future__ import annotations

import httpx
import pytest

# scripts/test starts the server for these (see tests/gateway/conftest.py)
pytestmark = pytest.mark.vllm

TIMEOUT = httpx.Timeout(600.0)


def test_completions_with_token_ids_answer_prompt_ids_output_ids_and_logprobs(vllm_url: str) -> None:
    body = {"model": "tiny", "prompt": [5, 6, 7, 8], "max_tokens": 3, "logprobs": 1, "return_token_ids": True,
            "temperature": 0, "ignore_eos": True}  # fmt: skip
    choice = httpx.post(f"{vllm_url}/v1/completions", json=body, timeout=TIMEOUT).raise_for_status().json()
    choice = choice["choices"][0]
    assert choice["prompt_token_ids"] == [5, 6, 7, 8]
    assert len(choice["token_ids"]) == 3
    assert len(choice["logprobs"]["token_logprobs"]) == 3
    assert all(lp <= 0.0 for lp in choice["logprobs"]["token_logprobs"])


def test_chat_answers_the_rendered_prompt_ids(vllm_url: str) -> None:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "the tree"}], "max_tokens": 2,
            "logprobs": True, "return_token_ids": True, "seed": 1}  # fmt: skip
    answer = httpx.post(f"{vllm_url}/v1/chat/completions", json=body, timeout=TIMEOUT).raise_for_status().json()
    assert answer["prompt_token_ids"], "vLLM answers the chat template's rendered ids"
    choice = answer["choices"][0]
    assert len(choice["token_ids"]) == len(choice["logprobs"]["content"]) <= 2
