"""SGLang's native ``POST /generate``: what the gateway asks for, what it records, what it strips.

Request: ``input_ids`` (one prompt of token ids) or ``text``, ``sampling_params`` (``max_new_tokens``,
...), ``return_logprob``, ``logprob_start_len``, ``stream``. The gateway always asks for
``return_logprob: true``; for a text prompt also ``logprob_start_len: 0``, so the answer's
``meta_info.input_token_logprobs`` carries the prompt ids the engine tokenized (each entry
``[logprob, token_id, text]``; the first log-prob is null). The answer's
``meta_info.output_token_logprobs`` (``[logprob, token_id, text]`` per output token) gives the output
ids and their log-probs; ``meta_info.finish_reason`` is ``{"type": "stop" | "length" | "abort", ...}``.
Streamed chunks carry the text, ``output_ids`` and ``output_token_logprobs`` so far (cumulative; the
server's incremental mode, where each chunk has only its new tokens, is read too).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from sapwood.gateway.openai_format import MalformedAnswerError, RecordedChoice

#: ``meta_info`` fields that exist only because log-probs were asked for.
LOGPROB_FIELDS = (
    "output_token_logprobs", "output_top_logprobs", "output_token_ids_logprobs",
    "input_token_logprobs", "input_top_logprobs", "input_token_ids_logprobs",
)
INPUT_LOGPROB_FIELDS = tuple(f for f in LOGPROB_FIELDS if f.startswith("input_"))


def _is_ids(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in value)


def upstream_request(body: Any) -> dict[str, Any]:
    """The client's body plus ``return_logprob`` (and ``logprob_start_len: 0`` for a text prompt)."""
    if not isinstance(body, dict):
        raise ValueError(f"request body must be a JSON object, got {type(body).__name__}")
    ids, text = body.get("input_ids"), body.get("text")
    if ids is not None:
        if not _is_ids(ids) or not ids:
            raise ValueError("input_ids must be one non-empty list of token ids (batched /generate is not recorded; "
                             "send one prompt per request)")
    elif not isinstance(text, str):
        raise ValueError("/generate needs 'input_ids' (a list of token ids) or 'text' (one string; batches are "
                         "not recorded)")
    out = dict(body)
    out["return_logprob"] = True
    if ids is None:
        out["logprob_start_len"] = 0
    return out


def _pairs(value: Any, what: str) -> tuple[list[int], list[float | None]]:
    if not isinstance(value, list):
        raise MalformedAnswerError(f"upstream answer: meta_info.{what} must be a list, got {value!r:.80}")
    ids: list[int] = []
    lps: list[float | None] = []
    for k, entry in enumerate(value):
        if not isinstance(entry, list | tuple) or len(entry) < 2 or not isinstance(entry[1], int):
            raise MalformedAnswerError(
                f"upstream answer: meta_info.{what}[{k}] must be [logprob, token_id, ...], got {entry!r:.80}"
            )
        lp = entry[0]
        if lp is not None and (not isinstance(lp, int | float) or isinstance(lp, bool)):
            raise MalformedAnswerError(f"upstream answer: meta_info.{what}[{k}] log-prob {lp!r} is not a number")
        ids.append(int(entry[1]))
        lps.append(None if lp is None else float(lp))
    return ids, lps


def finish_type(meta: dict[str, Any]) -> str | None:
    """``meta_info.finish_reason.type`` (None while the stream runs)."""
    reason = meta.get("finish_reason")
    if isinstance(reason, dict):
        return str(reason.get("type") or "stop")
    return str(reason) if isinstance(reason, str) else None


def recorded_choices(client_body: dict[str, Any], answer: Any) -> list[RecordedChoice]:
    """The one generation of ``answer``: prompt ids (the client's ``input_ids``, else the engine's), output
    ids and log-probs; :class:`MalformedAnswerError` names what is missing."""
    if not isinstance(answer, dict) or not isinstance(answer.get("meta_info"), dict):
        raise MalformedAnswerError(f"upstream /generate answer has no 'meta_info' object: {answer!r:.120}")
    meta = answer["meta_info"]
    output_ids, lps = _pairs(meta.get("output_token_logprobs"), "output_token_logprobs")
    if any(lp is None for lp in lps):
        raise MalformedAnswerError("upstream answer: meta_info.output_token_logprobs has a null log-prob")
    prompt = client_body.get("input_ids")
    if prompt is None:
        prompt, _ = _pairs(meta.get("input_token_logprobs"), "input_token_logprobs")
    if not prompt:
        raise MalformedAnswerError("upstream answer: no prompt token ids (meta_info.input_token_logprobs is empty)")
    return [RecordedChoice(list(prompt), output_ids, [float(x) for x in lps if x is not None],
                           finish_type(meta) or "stop")]


def client_answer(client_body: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
    """``answer`` (or a streamed chunk) without the log-probs the client did not ask for."""
    out = copy.deepcopy(answer)
    meta = out.get("meta_info")
    if isinstance(meta, dict):
        if not client_body.get("return_logprob"):
            drop: tuple[str, ...] = LOGPROB_FIELDS
        elif "logprob_start_len" not in client_body and "input_ids" not in client_body:
            drop = INPUT_LOGPROB_FIELDS  # asked for by the gateway only
        else:
            drop = ()
        for name in drop:
            meta.pop(name, None)
    return out


@dataclass
class GenerateGather:
    """The chunks of one streamed ``/generate`` call so far, folded into a non-streamed answer."""

    output: list[list[Any]] = field(default_factory=list)
    inputs: list[list[Any]] = field(default_factory=list)
    finish_reason: Any = None

    def feed(self, chunk: dict[str, Any]) -> None:
        """Add one parsed ``data:`` chunk (cumulative or incremental)."""
        meta = chunk.get("meta_info") or {}
        new = meta.get("output_token_logprobs") or []
        done = meta.get("completion_tokens")
        if isinstance(done, int) and len(new) == done and done >= len(self.output):
            self.output = list(new)  # cumulative chunk: everything so far
        else:
            self.output += new
        if meta.get("input_token_logprobs"):
            self.inputs = list(meta["input_token_logprobs"])
        if meta.get("finish_reason"):
            self.finish_reason = meta["finish_reason"]

    def answer(self, *, aborted: bool) -> dict[str, Any]:
        """The gathered answer; an unfinished stream gets finish reason ``abort`` when ``aborted``."""
        reason = self.finish_reason or ({"type": "abort"} if aborted else None)
        return {"meta_info": {"output_token_logprobs": self.output, "input_token_logprobs": self.inputs,
                              "finish_reason": reason}}


__all__ = ["GenerateGather", "client_answer", "finish_type", "recorded_choices", "upstream_request"]
