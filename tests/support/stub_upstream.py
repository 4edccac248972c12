"""A tiny stand-in for a vLLM OpenAI-compatible server: answers at once, in vLLM's format.

Text is tokenized as one id per character (``ord``); chat messages render ChatML-like as
``[1] + ids(role + ":" + content) + [2]`` each, plus ``[1] + ids("assistant:")`` as the generation
prompt, so an assistant message re-rendered in the next prompt continues the previous context
verbatim. The output is ``max_tokens`` characters of ``"abcdefgh..."`` shifted by the prompt length;
log-probs are ``-0.25 * (k + 1)``.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

ALPHABET = "abcdefghijklmnopqrstuvwxyz"


def text_ids(text: str) -> list[int]:
    return [ord(c) for c in text]


def render_chat(messages: list[dict[str, Any]]) -> list[int]:
    ids: list[int] = []
    for m in messages:
        ids += [1, *text_ids(f"{m['role']}:{m['content']}"), 2]
    return [*ids, 1, *text_ids("assistant:")]


def generate(prompt_ids: list[int], max_tokens: int) -> tuple[list[int], list[float], str]:
    text = "".join(ALPHABET[(len(prompt_ids) + k) % 26] for k in range(max_tokens))
    return text_ids(text), [-0.25 * (k + 1) for k in range(max_tokens)], text


def sse(chunks: list[dict[str, Any]], hang_after: int | None = None) -> StreamingResponse:
    """``chunks`` as server-sent events, then ``[DONE]``; ``hang_after``: stop sending after that many
    chunks and wait forever (a client that gives up mid-stream)."""

    async def events() -> Any:
        for k, chunk in enumerate(chunks):
            if k == hang_after:
                await asyncio.Event().wait()
            yield f"data: {json.dumps(chunk)}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


def stream_chunks(answer: dict[str, Any], endpoint: str) -> list[dict[str, Any]]:
    """A non-streamed stand-in answer cut into one chunk per token, as vLLM streams it."""
    choice = answer["choices"][0]
    ids, n = choice.get("token_ids"), len(choice.get("token_ids") or [1, 1])
    first: dict[str, Any] = {"choices": []}
    if endpoint == "chat" and "prompt_token_ids" in answer:
        first["prompt_token_ids"] = answer["prompt_token_ids"]
    elif "prompt_token_ids" in choice:
        first["choices"] = [{"index": 0, "text": "", "prompt_token_ids": choice["prompt_token_ids"]}]
    chunks = [first]
    text = choice["text"] if endpoint == "completions" else choice["message"]["content"]
    for k in range(len(text)):
        c: dict[str, Any] = {"index": 0, "finish_reason": choice["finish_reason"] if k == n - 1 else None}
        if endpoint == "completions":
            c["text"] = text[k]
            c["logprobs"] = choice["logprobs"] and {"token_logprobs": [choice["logprobs"]["token_logprobs"][k]]}
        else:
            c["delta"] = {"content": text[k]}
            c["logprobs"] = choice["logprobs"] and {"content": [choice["logprobs"]["content"][k]]}
        if ids is not None:
            c["token_ids"] = [ids[k]]
        chunks.append({"choices": [c]})
    return chunks


def stub_app(*, malformed: bool = False, hang_after: int | None = None, fail_status: int | None = None) -> FastAPI:
    """The stand-in; ``malformed=True`` answers without token ids (an upstream that ignores the request);
    ``hang_after``: streams stall after that many chunks; ``fail_status``: every POST is answered with
    that status (after it is logged in ``state.requests``)."""
    app = FastAPI()
    app.state.requests = []

    if fail_status is not None:

        @app.middleware("http")
        async def fail(request: Request, call_next: Any) -> Response:
            if request.method == "POST":
                app.state.requests.append(await request.json())
                return JSONResponse({"error": "stand-in failure"}, status_code=fail_status)
            return await call_next(request)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body = await request.json()
        app.state.requests.append(body)
        prompt = body["prompt"]
        prompt_ids = text_ids(prompt) if isinstance(prompt, str) else list(prompt)
        out, lps, text = generate(prompt_ids, int(body.get("max_tokens", 4)))
        choice: dict[str, Any] = {"index": 0, "text": text, "finish_reason": "length", "logprobs": None}
        if body.get("logprobs") is not None:
            choice["logprobs"] = {
                "tokens": list(text),
                "token_logprobs": lps,
                "top_logprobs": [{c: lp} for c, lp in zip(text, lps, strict=True)],
                "text_offset": list(range(len(text))),
            }
        if body.get("return_token_ids") and not malformed:
            choice["prompt_token_ids"] = prompt_ids
            choice["token_ids"] = out
        answer = {
            "id": "cmpl-1",
            "object": "text_completion",
            "model": body.get("model", "tiny"),
            "choices": [choice],
            "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(out)},
        }
        return sse(stream_chunks(answer, "completions"), hang_after) if body.get("stream") else JSONResponse(answer)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        body = await request.json()
        app.state.requests.append(body)
        prompt_ids = render_chat(body["messages"])
        out, lps, text = generate(prompt_ids, int(body.get("max_tokens", 4)))
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "finish_reason": "length",
            "logprobs": None,
        }
        if body.get("logprobs"):
            choice["logprobs"] = {
                "content": [{"token": c, "logprob": lp, "top_logprobs": []} for c, lp in zip(text, lps, strict=True)]
            }
        answer: dict[str, Any] = {
            "id": "chat-1",
            "object": "chat.completion",
            "model": body.get("model", "tiny"),
            "choices": [choice],
        }
        if body.get("return_token_ids") and not malformed:
            answer["prompt_token_ids"] = prompt_ids
            choice["token_ids"] = out
        return sse(stream_chunks(answer, "chat"), hang_after) if body.get("stream") else JSONResponse(answer)

    @app.post("/generate")
    async def generate_native(request: Request) -> Response:
        """SGLang's native shape: ``text``, ``output_ids``, ``meta_info`` with ``[logprob, id, text]`` lists."""
        body = await request.json()
        app.state.requests.append(body)
        prompt_ids = list(body["input_ids"]) if "input_ids" in body else text_ids(body["text"])
        n = int((body.get("sampling_params") or {}).get("max_new_tokens", 4))
        out, lps, text = generate(prompt_ids, n)

        def meta(k: int) -> dict[str, Any]:
            m: dict[str, Any] = {
                "id": "gen-1", "prompt_tokens": len(prompt_ids), "completion_tokens": k, "cached_tokens": 0,
                "finish_reason": {"type": "length", "length": n} if k == n else None,
            }
            if body.get("return_logprob"):
                m["output_token_logprobs"] = [[lp, i, None] for lp, i in zip(lps[:k], out[:k], strict=True)]
                start = body.get("logprob_start_len")
                m["input_token_logprobs"] = (
                    [[None if j == 0 else -1.0, i, None] for j, i in enumerate(prompt_ids)] if start == 0 else []
                )
                if malformed:
                    m.pop("output_token_logprobs")
            return m

        if body.get("stream"):  # cumulative chunks, one per token, as SGLang streams by default
            chunks = [{"text": text[:k], "output_ids": out[:k], "meta_info": meta(k)} for k in range(1, n + 1)]
            return sse(chunks, hang_after)
        return JSONResponse({"text": text, "output_ids": out, "meta_info": meta(n)})

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": "tiny", "object": "model"}]}

    return app
