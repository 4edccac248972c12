"""Server-sent-event streams: chunks pass through as they arrive, and are gathered into one answer.

vLLM streams ``prompt_token_ids`` in the first chunk (completions: per choice; chat: top level), and each
chunk's new ``token_ids`` and log-probs. :class:`StreamGather` folds the chunks into the shape of a
non-streamed answer, so :func:`~sapwood.gateway.openai_format.recorded_choices` reads both alike.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from sapwood.gateway.openai_format import Endpoint


@dataclass
class _Choice:
    prompt_ids: list[int] | None = None
    token_ids: list[int] = field(default_factory=list)
    token_logprobs: list[float] = field(default_factory=list)
    content: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str | None = None


@dataclass
class StreamGather:
    """The chunks of one stream so far, per choice index."""

    endpoint: Endpoint
    prompt_ids: list[int] | None = None
    choices: dict[int, _Choice] = field(default_factory=dict)

    def feed(self, chunk: dict[str, Any]) -> None:
        """Add one parsed ``data:`` chunk."""
        if isinstance(chunk.get("prompt_token_ids"), list):
            self.prompt_ids = chunk["prompt_token_ids"]
        for c in chunk.get("choices") or []:
            ch = self.choices.setdefault(int(c.get("index", 0)), _Choice())
            if isinstance(c.get("prompt_token_ids"), list):
                ch.prompt_ids = c["prompt_token_ids"]
            ch.token_ids += c.get("token_ids") or []
            lp = c.get("logprobs") or {}
            ch.token_logprobs += lp.get("token_logprobs") or []
            ch.content += lp.get("content") or []
            if c.get("finish_reason"):
                ch.finish_reason = c["finish_reason"]

    def answer(self, *, aborted: bool) -> dict[str, Any]:
        """The gathered answer; choices still open get finish reason ``abort`` when ``aborted``."""
        out: dict[str, Any] = {"choices": []}
        if self.prompt_ids is not None:
            out["prompt_token_ids"] = self.prompt_ids
        for index in sorted(self.choices):
            ch = self.choices[index]
            reason = ch.finish_reason or ("abort" if aborted else None)
            lp: dict[str, Any] = (
                {"token_logprobs": ch.token_logprobs} if self.endpoint == "completions" else {"content": ch.content}
            )
            out["choices"].append(
                {
                    "index": index,
                    "prompt_token_ids": ch.prompt_ids,
                    "token_ids": ch.token_ids,
                    "logprobs": lp,
                    "finish_reason": reason,
                }
            )
        return out


def parse_sse_data(line: str) -> dict[str, Any] | None:
    """The JSON object of a ``data: {...}`` line (None for other lines and ``[DONE]``)."""
    if not line.startswith("data:"):
        return None
    payload = line[5:].strip()
    if not payload or payload == "[DONE]":
        return None
    value = json.loads(payload)
    return value if isinstance(value, dict) else None
