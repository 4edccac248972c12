"""What the gateway asks an OpenAI-compatible upstream for, what it reads back, and what it strips.

The upstream (vLLM >= 0.10.2 semantics) is asked for ``return_token_ids`` and log-probs; the answer's
``prompt_token_ids`` (completions: per choice; chat: top level), ``choices[].token_ids`` and the sampled
tokens' log-probs are what gets recorded. Fields the client did not ask for are removed before the answer
goes back, so the client sees what it would have seen without the gateway.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Endpoint = Literal["completions", "chat"]


class MalformedAnswerError(ValueError):
    """The upstream's answer lacks the token ids / log-probs the gateway needs; the message says which."""


@dataclass(frozen=True)
class RecordedChoice:
    """One choice of an answer: exact prompt ids [p], output ids [n] and their rollout log-probs [n]."""

    prompt_ids: list[int]
    output_ids: list[int]
    logprobs: list[float]
    finish_reason: str


def upstream_request(endpoint: Endpoint, body: dict[str, Any]) -> dict[str, Any]:
    """The client's request body plus what recording needs (the client's own body is not changed)."""
    if not isinstance(body, dict):
        raise ValueError(f"request body must be a JSON object, got {type(body).__name__}")
    out = dict(body)
    out["return_token_ids"] = True
    if endpoint == "completions":
        out["logprobs"] = max(int(body.get("logprobs") or 0), 1)
    else:
        out["logprobs"] = True
    return out


def _ids(value: Any, what: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        raise MalformedAnswerError(f"upstream answer: {what} must be a list of token ids, got {value!r:.80}")
    return list(value)


def _floats(value: Any, what: str) -> list[float]:
    if not isinstance(value, list) or not all(isinstance(x, int | float) and not isinstance(x, bool) for x in value):
        raise MalformedAnswerError(f"upstream answer: {what} must be a list of numbers, got {value!r:.80}")
    return [float(x) for x in value]


def recorded_choices(endpoint: Endpoint, answer: Any) -> list[RecordedChoice]:
    """Prompt ids, output ids and log-probs of every choice; :class:`MalformedAnswerError` if missing."""
    if not isinstance(answer, dict) or not isinstance(answer.get("choices"), list) or not answer["choices"]:
        raise MalformedAnswerError(f"upstream answer has no 'choices' list: {answer!r:.120}")
    out = []
    for k, choice in enumerate(answer["choices"]):
        if not isinstance(choice, dict):
            raise MalformedAnswerError(f"upstream answer: choices[{k}] is not an object")
        prompt = choice.get("prompt_token_ids") if endpoint == "completions" else answer.get("prompt_token_ids")
        prompt_ids = _ids(prompt, f"prompt_token_ids of choice {k}")
        output_ids = _ids(choice.get("token_ids"), f"choices[{k}].token_ids")
        lp = choice.get("logprobs")
        if not isinstance(lp, dict):
            raise MalformedAnswerError(f"upstream answer: choices[{k}].logprobs is missing")
        if endpoint == "completions":
            logprobs = _floats(lp.get("token_logprobs"), f"choices[{k}].logprobs.token_logprobs")
        else:
            content = lp.get("content")
            if not isinstance(content, list) or not all(isinstance(c, dict) for c in content):
                raise MalformedAnswerError(f"upstream answer: choices[{k}].logprobs.content must be a list")
            logprobs = _floats([c.get("logprob") for c in content], f"choices[{k}].logprobs.content[].logprob")
        if len(logprobs) != len(output_ids):
            raise MalformedAnswerError(
                f"upstream answer: choice {k} has {len(output_ids)} token ids but "
                f"{len(logprobs)} log-probs; expected one per token"
            )
        if not prompt_ids:
            raise MalformedAnswerError(f"upstream answer: choice {k} has empty prompt_token_ids")
        out.append(RecordedChoice(prompt_ids, output_ids, logprobs, str(choice.get("finish_reason") or "stop")))
    return out


def client_answer(endpoint: Endpoint, client_body: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
    """``answer`` without the token ids / log-probs the client's own request did not ask for."""
    # only top-level keys and the choices' own keys change: copy those dicts, share everything below
    out = dict(answer)
    if isinstance(answer.get("choices"), list):
        out["choices"] = [dict(c) if isinstance(c, dict) else c for c in answer["choices"]]
    wants_ids = bool(client_body.get("return_token_ids"))
    wants_lp = bool(client_body.get("logprobs")) if endpoint == "chat" else client_body.get("logprobs") is not None
    if not wants_ids:
        out.pop("prompt_token_ids", None)
    for choice in out.get("choices", []):
        if not isinstance(choice, dict):
            continue
        if not wants_ids:
            choice.pop("prompt_token_ids", None)
            choice.pop("token_ids", None)
        if not wants_lp:
            choice["logprobs"] = None
    return out
