"""The recording proxy: OpenAI-compatible endpoints in front of one or more upstreams (non-streaming).

Each call's exact prompt ids, output ids and log-probs become a TITO ``model_call`` event of the
session's execution, through the rollout SDK's :class:`~sapwood.rollout.recorder.Recorder` (the same
events an SDK-instrumented rollout writes). The session is named by ``/s/{session}/v1/...`` or
``X-Session-Id``; a session maps to one execution and to one upstream (stable hash of its id).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import threading
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from sapwood.gateway.openai_format import (
    Endpoint,
    MalformedAnswerError,
    client_answer,
    recorded_choices,
    upstream_request,
)
from sapwood.gateway.sessions import Session, SessionError, SessionRef, SessionTable, resolve
from sapwood.gateway.streaming import StreamGather, parse_sse_data
from sapwood.rollout.recorder import ExecutionRecorder, Recorder
from sapwood.rollout.transports import Transport

FINISH_STATUSES = ("success", "error", "timeout")


def pick_upstream(upstreams: Sequence[str], session_id: str) -> str:
    """The upstream a session is pinned to: a stable hash of its id (same session -> same server cache)."""
    h = int.from_bytes(hashlib.blake2b(session_id.encode(), digest_size=8).digest(), "big")
    return upstreams[h % len(upstreams)]


@dataclass
class GatewayConfig:
    """``upstreams``: base URLs (without ``/v1``); ``idle_timeout_s``: seconds until an idle session ends."""

    upstreams: list[str]
    run_id: str = "gateway"
    engine: str = "vllm"
    idle_timeout_s: float = 600.0
    upstream_timeout_s: float = 600.0
    vocab_size: int | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.upstreams:
            raise ValueError("at least one --upstream URL is needed (e.g. http://127.0.0.1:8000)")
        for url in self.upstreams:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"upstream {url!r} must be an http:// or https:// base URL")
        self.upstreams = [u.rstrip("/").removesuffix("/v1") for u in self.upstreams]


class Gateway:
    """Sessions, their executions and the recording of calls (thread-safe; recording runs off the loop)."""

    def __init__(self, config: GatewayConfig, transport: Transport) -> None:
        self.config = config
        self.transport = transport
        self.sessions = SessionTable(config.idle_timeout_s)
        self.executions: dict[str, ExecutionRecorder] = {}
        self._recorders: dict[str, Recorder] = {}
        self._lock = threading.Lock()
        self.registry = CollectorRegistry()
        self.calls = Counter("sapwood_gateway_calls", "proxied calls", ["endpoint", "outcome"], registry=self.registry)
        self.placements = Counter(
            "sapwood_gateway_placements", "tree placement of recorded calls", ["kind"], registry=self.registry
        )
        self.latency = Histogram(
            "sapwood_gateway_call_seconds", "whole call through the gateway", ["endpoint"], registry=self.registry
        )
        self.sessions_ended = Counter(
            "sapwood_gateway_sessions_ended", "sessions ended", ["status"], registry=self.registry
        )

    def _recorder(self, run_id: str) -> Recorder:
        rec = self._recorders.get(run_id)
        if rec is None:
            rec = self._recorders[run_id] = Recorder(
                self.transport, run_id=run_id, engine=self.config.engine, vocab_size=self.config.vocab_size
            )
        return rec

    def _execution(self, session: Session) -> ExecutionRecorder:
        ex = self.executions.get(session.session_id)
        if ex is None:
            labels = session.labels
            meta = {
                **self.config.metadata,
                "session_id": session.session_id,
                **{k: v for k, v in labels.items() if k in ("parent_session", "policy_version")},
            }
            ex = self._recorder(labels.get("run", self.config.run_id)).start(
                labels.get("task", session.session_id), task_family=labels.get("task_family"), metadata=meta
            )
            self.executions[session.session_id] = ex
        return ex

    def record(self, ref: SessionRef, endpoint: Endpoint, answer: dict[str, Any]) -> list[tuple[str, str]]:
        """Record every choice of ``answer`` in the session's execution; returns (placement kind, call id)s."""
        choices = recorded_choices(endpoint, answer)
        kinds: list[tuple[str, str]] = []
        with self._lock:
            session = self.sessions.touch(ref, time.monotonic())
            ex = self._execution(session)
            version = int(ref.labels.get("policy_version", "0") or 0)
            for c in choices:
                placement = session.tree.add(c.prompt_ids, c.output_ids)
                call = ex.call(
                    c.prompt_ids, c.output_ids, c.logprobs, policy_version=version, finish_reason=c.finish_reason
                )
                self.placements.labels(placement.kind).inc()
                kinds.append((placement.kind, call.call_id))
        return kinds

    def finish(self, session_id: str, status: str, reward: float | None, partial_score: float | None) -> str:
        """End a session's execution with ``status`` (and reward / partial score); returns its execution id."""
        if status not in FINISH_STATUSES:
            raise ValueError(f"status must be one of {', '.join(FINISH_STATUSES)}, got {status!r}")
        with self._lock:
            self.sessions.finish(session_id, status)
            ex = self.executions.pop(session_id)
            if partial_score is not None:
                ex.score(partial_score)
            ex.finish(status, reward)
            self.sessions_ended.labels(status).inc()
            return ex.execution_id

    def expire_idle(self, now: float) -> list[str]:
        """End every session idle past the timeout as ``timeout``; returns their session ids."""
        with self._lock:
            ended = self.sessions.expire(now)
            for s in ended:
                ex = self.executions.pop(s.session_id, None)
                if ex is not None:
                    ex.finish("timeout")
                self.sessions_ended.labels("timeout").inc()
        return [s.session_id for s in ended]


def _error(status: int, message: str, kind: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind}}, status_code=status)


def create_app(config: GatewayConfig, transport: Transport, *, client: httpx.AsyncClient | None = None) -> FastAPI:
    """The gateway as an ASGI app; ``client`` (tests) replaces the upstream HTTP client."""
    gw = Gateway(config, transport)
    http = client or httpx.AsyncClient(timeout=httpx.Timeout(config.upstream_timeout_s))

    async def _expiry_loop() -> None:
        period = min(config.idle_timeout_s / 4, 5.0)
        while True:
            await asyncio.sleep(period)
            await asyncio.to_thread(gw.expire_idle, time.monotonic())

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        expiry = asyncio.create_task(_expiry_loop())
        yield
        expiry.cancel()
        if client is None:
            await http.aclose()

    app = FastAPI(title="sapwood gateway", lifespan=lifespan)
    app.state.gateway = gw

    async def _proxy(request: Request, endpoint: Endpoint) -> Response:
        t0 = time.perf_counter()
        try:
            ref = resolve(request.url.path, dict(request.headers))
        except SessionError as exc:
            return _error(400, str(exc), "invalid_request_error")
        try:
            body = await request.json()
            up_body = upstream_request(endpoint, body)
        except ValueError as exc:
            return _error(400, f"request body must be a JSON object: {exc}", "invalid_request_error")
        path = "/v1/completions" if endpoint == "completions" else "/v1/chat/completions"
        url = pick_upstream(config.upstreams, ref.session_id) + path
        if body.get("stream"):
            return await _stream(ref, endpoint, body, up_body, url)
        try:
            upstream = await http.post(url, json=up_body)
        except httpx.HTTPError as exc:
            gw.calls.labels(endpoint, "upstream_error").inc()
            return _error(502, f"upstream {url} unreachable: {exc}", "upstream_error")
        if upstream.status_code != 200:
            gw.calls.labels(endpoint, "upstream_status").inc()
            return Response(
                upstream.content, status_code=upstream.status_code, media_type=upstream.headers.get("content-type")
            )
        try:
            answer = upstream.json()
            kinds = await asyncio.to_thread(gw.record, ref, endpoint, answer)
        except (ValueError, MalformedAnswerError) as exc:
            gw.calls.labels(endpoint, "malformed").inc()
            return _error(502, f"malformed upstream answer from {url}: {exc}", "upstream_error")
        gw.calls.labels(endpoint, "recorded").inc()
        gw.latency.labels(endpoint).observe(time.perf_counter() - t0)
        headers = {
            "X-Sapwood-Placement": ",".join(k for k, _ in kinds),
            "X-Sapwood-Call-Id": ",".join(c for _, c in kinds),
        }
        return JSONResponse(client_answer(endpoint, body, answer), headers=headers)

    def _record_gathered(ref: SessionRef, endpoint: Endpoint, gather: StreamGather, aborted: bool) -> None:
        try:
            gw.record(ref, endpoint, gather.answer(aborted=aborted))
        except MalformedAnswerError:
            gw.calls.labels(endpoint, "malformed").inc()
        else:
            gw.calls.labels(endpoint, "aborted" if aborted else "recorded").inc()

    async def _stream(
        ref: SessionRef, endpoint: Endpoint, body: dict[str, Any], up_body: dict[str, Any], url: str
    ) -> Response:
        try:
            upstream = await http.send(http.build_request("POST", url, json=up_body), stream=True)
        except httpx.HTTPError as exc:
            gw.calls.labels(endpoint, "upstream_error").inc()
            return _error(502, f"upstream {url} unreachable: {exc}", "upstream_error")
        if upstream.status_code != 200:
            content = await upstream.aread()
            await upstream.aclose()
            gw.calls.labels(endpoint, "upstream_status").inc()
            return Response(content, status_code=upstream.status_code, media_type=upstream.headers.get("content-type"))
        gather = StreamGather(endpoint)

        async def relay() -> AsyncIterator[str]:
            complete = False
            try:
                async for line in upstream.aiter_lines():
                    chunk = parse_sse_data(line)
                    if chunk is None:
                        complete = complete or line.strip() == "data: [DONE]"
                        yield line + "\n"
                        continue
                    gather.feed(chunk)
                    yield "data: " + json.dumps(client_answer(endpoint, body, chunk)) + "\n"
                complete = True
            finally:
                await upstream.aclose()
                if complete:
                    await asyncio.to_thread(_record_gathered, ref, endpoint, gather, False)
                else:  # client gone or upstream died: record what arrived, as finish reason "abort"
                    _record_gathered(ref, endpoint, gather, True)

        return StreamingResponse(relay(), media_type="text/event-stream")

    async def completions(request: Request) -> Response:
        return await _proxy(request, "completions")

    async def chat(request: Request) -> Response:
        return await _proxy(request, "chat")

    for prefix in ("", "/s/{session}"):
        app.post(prefix + "/v1/completions")(completions)
        app.post(prefix + "/v1/chat/completions")(chat)

        @app.get(prefix + "/v1/models")
        async def models() -> Response:
            r = await http.get(config.upstreams[0] + "/v1/models")
            return Response(r.content, status_code=r.status_code, media_type=r.headers.get("content-type"))

    @app.post("/v1/sessions/{session_id}/finish")
    async def finish(session_id: str, request: Request) -> Response:
        body = await request.json() if await request.body() else {}
        try:
            execution_id = await asyncio.to_thread(
                gw.finish, session_id, body.get("status", "success"), body.get("reward"), body.get("partial_score")
            )
        except KeyError as exc:
            return _error(404, str(exc.args[0]), "not_found")
        except ValueError as exc:
            return _error(400, str(exc), "invalid_request_error")
        return JSONResponse({"session_id": session_id, "execution_id": execution_id})

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "open_sessions": len(gw.sessions.open), "upstreams": config.upstreams}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(gw.registry), media_type="text/plain; version=0.0.4")

    return app
