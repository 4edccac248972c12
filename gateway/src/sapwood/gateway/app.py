"""The recording proxy: OpenAI-compatible and SGLang ``/generate`` endpoints in front of one or more upstreams.

Each call's exact prompt ids, output ids and log-probs become a TITO ``model_call`` event of the
session's execution, through the rollout SDK's :class:`~sapwood.rollout.recorder.Recorder` (the same
events an SDK-instrumented rollout writes). The session is named by ``/s/{session}/v1/...`` or
``X-Session-Id``; a session maps to one execution and to one upstream (stable hash of its id); an
upstream 5xx or connection error before any byte reached the client is retried on the next upstream.
Events go through a :class:`~sapwood.gateway.recording.BackgroundRecorder` (``ack="async"``: answer
once queued; ``"durable"``: answer once the transport acknowledged the call's event). While the
transport fails or the backlog is full, calls are refused with 429 (or, ``fail_open``, forwarded
unrecorded and counted).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from sapwood.gateway import json_codec, openai_format, sglang_format
from sapwood.gateway.drift import DriftCheck, check_drift
from sapwood.gateway.ingest_lag import LagGuard, LagReader
from sapwood.gateway.journal import JournaledTransport, SessionJournal
from sapwood.gateway.model_dir import folder_from_models, tokenizer_metadata
from sapwood.gateway.openai_format import MalformedAnswerError, RecordedChoice
from sapwood.gateway.recording import ACK_MODES, Admission, BackgroundRecorder
from sapwood.gateway.restart import resume_sessions
from sapwood.gateway.sessions import Session, SessionError, SessionRef, SessionTable, resolve
from sapwood.gateway.sglang_format import GenerateGather
from sapwood.gateway.streaming import StreamGather, parse_sse_data
from sapwood.platform.events import ExecutionFinished, ModelCall, PartialScore
from sapwood.rollout.recorder import ExecutionRecorder, Recorder
from sapwood.rollout.transports import Transport

log = logging.getLogger(__name__)

Route = Literal["completions", "chat", "generate"]
ROUTE_PATHS: dict[Route, str] = {
    "completions": "/v1/completions",
    "chat": "/v1/chat/completions",
    "generate": "/generate",
}

FINISH_STATUSES = ("success", "error", "timeout")


def upstream_order(upstreams: Sequence[str], session_id: str) -> list[str]:
    """The upstreams in the order a session tries them: its pinned one (stable hash of its id, so the
    same session hits the same server cache) first, then the next ones round the list."""
    h = int.from_bytes(hashlib.blake2b(session_id.encode(), digest_size=8).digest(), "big") % len(upstreams)
    return [*upstreams[h:], *upstreams[:h]]


def pick_upstream(upstreams: Sequence[str], session_id: str) -> str:
    """The upstream a session is pinned to."""
    return upstream_order(upstreams, session_id)[0]


def upstream_body(route: Route, body: Any) -> dict[str, Any]:
    """What the upstream is asked (the client's body plus what recording needs)."""
    if route == "generate":
        return sglang_format.upstream_request(body)
    return openai_format.upstream_request(route, body)


def answer_choices(route: Route, body: dict[str, Any], answer: Any) -> list[RecordedChoice]:
    """The recorded choices of an answer (:class:`MalformedAnswerError` names what is missing)."""
    if route == "generate":
        return sglang_format.recorded_choices(body, answer)
    return openai_format.recorded_choices(route, answer)


def stripped(route: Route, body: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
    """The answer (or chunk) the client gets: without what only the gateway asked for."""
    if route == "generate":
        return sglang_format.client_answer(body, answer)
    return openai_format.client_answer(route, body, answer)


@dataclass
class GatewayConfig:
    """``upstreams``: base URLs (without ``/v1``); ``idle_timeout_s``: seconds until an idle session ends."""

    upstreams: list[str]
    run_id: str = "gateway"
    engine: str = "vllm"
    idle_timeout_s: float = 600.0
    upstream_timeout_s: float = 600.0
    #: Upstream connections kept open (and at most open): above the concurrent calls, so none is
    #: closed and opened again per call (httpx's default keeps 20).
    upstream_connections: int = 1024
    #: Seconds an idle upstream connection is kept: below the upstream's own keep-alive timeout (uvicorn,
    #: under vLLM and SGLang: 5 s), so the gateway never reuses a connection the server is closing (a
    #: ReadError and a 502; httpx's default expiry is that same 5 s).
    upstream_keepalive_s: float = 2.0
    vocab_size: int | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    #: ``async``: answer once the call's events are queued; ``durable``: once the transport acknowledged them.
    ack: str = "async"
    #: Refused (False: 429 + Retry-After) or forwarded unrecorded (True) while recording cannot keep up.
    fail_open: bool = False
    #: Events queued and not delivered (plus calls in flight) above which calls are refused.
    max_pending: int = 10_000
    #: Events per transaction / flush of the background recorder.
    batch_size: int = 256
    retry_after_s: int = 1
    #: Seconds a durable call waits for its acknowledgement before it is answered 429.
    durable_timeout_s: float = 30.0
    #: Upstreams tried per call (5xx or connection error before any byte reached the client).
    max_attempts: int = 2
    #: Finished sessions whose execution can still get score revisions (the oldest are forgotten).
    keep_finished: int = 1000
    #: Seconds shutdown waits for the recorder to hand every queued event on; past it, shutdown fails
    #: loudly with the count of undelivered events (never a silent drop, never a hang).
    drain_timeout_s: float = 30.0
    #: Seconds the recorder waits for the transport to acknowledge a batch before it counts the transport
    #: as unavailable (calls get 429 or pass unrecorded) and retries.
    transport_timeout_s: float = 5.0
    #: Records the ingest consumer group may be behind the events topic; past it, calls get 429 (or pass
    #: unrecorded with ``fail_open``). None: not watched.
    max_ingest_lag: int | None = None
    #: Seconds between two ingest-lag readings.
    lag_interval_s: float = 2.0
    #: File where every recorded event is journaled before it is queued, so a restarted gateway continues
    #: the sessions it had open (None: no journal; a restart then starts new executions for them).
    journal_path: str | None = None
    #: Force each journal append to the disk (survives a power loss, not only a killed process).
    journal_fsync: bool = False
    #: The upstream's model folder: its tokenizer is named in each execution (None: the folder the first
    #: upstream's ``/v1/models`` names, when it is readable here).
    upstream_model_dir: str | None = None

    def __post_init__(self) -> None:
        if self.ack not in ACK_MODES:
            raise ValueError(f"ack must be one of {', '.join(ACK_MODES)}, got {self.ack!r}")
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if not self.upstreams:
            raise ValueError("at least one --upstream URL is needed (e.g. http://127.0.0.1:8000)")
        for url in self.upstreams:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"upstream {url!r} must be an http:// or https:// base URL")
        self.upstreams = [u.rstrip("/").removesuffix("/v1") for u in self.upstreams]


class Gateway:
    """Sessions, their executions and the recording of calls (thread-safe; recording runs off the loop)."""

    def __init__(self, config: GatewayConfig, transport: Transport, ingest_lag: LagReader | None = None) -> None:
        self.config = config
        self.recorder = BackgroundRecorder(
            transport, batch_size=config.batch_size, max_pending=config.max_pending,
            flush_timeout_s=config.transport_timeout_s, track_acks=config.ack == "durable",
        )
        self.transport: Transport = self.recorder
        self.sessions = SessionTable(config.idle_timeout_s)
        self.executions: dict[str, ExecutionRecorder] = {}
        self.finished: OrderedDict[str, ExecutionRecorder] = OrderedDict()
        self._recorders: dict[str, Recorder] = {}
        self._lock = threading.Lock()
        #: ``tokenizer`` / ``tokenizer_sha256`` of the upstream's tokenizer, put in each execution's metadata.
        self.tokenizer: dict[str, str] = (
            tokenizer_metadata(config.upstream_model_dir) if config.upstream_model_dir else {})
        self.journal: SessionJournal | None = None
        #: Sessions continued from the journal when this gateway started.
        self.resumed_sessions = 0
        if config.journal_path is not None:
            self.journal = SessionJournal(config.journal_path, fsync=config.journal_fsync)
            self.transport = JournaledTransport(self.recorder, self.journal)  # before any Recorder is made
            self.resumed_sessions = resume_sessions(self)
        self.registry = CollectorRegistry()
        def counter(name: str, doc: str, label: str) -> Counter:
            return Counter(name, doc, [label], registry=self.registry)

        self.calls = Counter("sapwood_gateway_calls", "proxied calls", ["endpoint", "outcome"], registry=self.registry)
        self.placements = counter("sapwood_gateway_placements", "tree placement of recorded calls", "kind")
        self.latency = Histogram(
            "sapwood_gateway_call_seconds", "whole call through the gateway", ["endpoint"], registry=self.registry
        )
        self.sessions_ended = counter("sapwood_gateway_sessions_ended", "sessions ended", "status")
        self.refused = counter("sapwood_gateway_refused_calls", "calls answered 429: recording unavailable", "reason")
        self.unrecorded = counter(
            "sapwood_gateway_unrecorded_calls", "calls forwarded without recording (--fail-open)", "reason"
        )
        self.retries = counter("sapwood_gateway_upstream_retries", "calls retried on the next upstream", "reason")
        self.ack_lag = Histogram(
            "sapwood_gateway_ack_lag_seconds", "event queued -> delivered by the transport (async risk window)",
            registry=self.registry, buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5),
        )
        self.ingest_lag = Gauge(
            "sapwood_gateway_ingest_lag", "records the ingest consumer group is behind the events topic",
            registry=self.registry,
        )
        self.drift_checked = counter(
            "sapwood_gateway_drift_checked", "chat turns checked for retokenization drift", "run"
        )
        self.drifted = counter(
            "sapwood_gateway_drift", "chat turns whose previous output ids did not come back verbatim", "run"
        )
        self.lag_guard: LagGuard | None = None
        if config.max_ingest_lag is not None:
            if ingest_lag is None:
                raise ValueError("max_ingest_lag needs an ingest lag reader (Kafka: --bootstrap)")
            self.lag_guard = LagGuard(ingest_lag, config.max_ingest_lag, interval_s=config.lag_interval_s,
                                      on_reading=self.ingest_lag.set)

    def admit(self) -> Admission:
        """Whether a call may be recorded now: not while ingest lags past the limit, nor while the
        recorder refuses (transport down, backlog full); an admitted call must be released."""
        if self.lag_guard is not None and self.lag_guard.over:
            return Admission(False, "ingest_lag")
        return self.recorder.admit()

    def recorder_for(self, run_id: str) -> Recorder:
        """The rollout SDK recorder of one run (made on first use)."""
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
                **self.tokenizer,
                "session_id": session.session_id,
                **{k: v for k, v in labels.items() if k in ("parent_session", "policy_version")},
            }
            ex = self.recorder_for(labels.get("run", self.config.run_id)).start(
                labels.get("task", session.session_id), task_family=labels.get("task_family"), metadata=meta
            )
            self.executions[session.session_id] = ex
        return ex

    def record(self, ref: SessionRef, choices: list[RecordedChoice], *, chat: bool = False
               ) -> list[tuple[str, ModelCall]]:
        """Record ``choices`` in the session's execution; returns (placement kind, call event)s.

        ``chat``: check each choice's prompt for retokenization drift against the session's last call
        (counted per run in the metrics, and kept on the call event: ``drift_checked``, ``drift_at``)."""
        kinds: list[tuple[str, ModelCall]] = []
        with self._lock:
            session = self.sessions.touch(ref, time.monotonic())
            ex = self._execution(session)
            version = int(ref.labels.get("policy_version", "0") or 0)
            run = session.labels.get("run", self.config.run_id)
            for c in choices:
                drift = DriftCheck(False)
                if chat and session.tree.contexts:
                    drift = self._check_drift(session, c.prompt_ids)
                    if drift.checked:
                        self.drift_checked.labels(run).inc()
                        if drift.position is not None:
                            self.drifted.labels(run).inc()
                    if drift.position is not None:
                        log.info("retokenization drift in session %s at prompt position %d",
                                 session.session_id, drift.position)
                placement = session.tree.add(c.prompt_ids, c.output_ids)
                # a next call continues the last call's output node: name it, instead of the recorder's
                # search of the whole execution tree for the longest prefix (O(calls) per call)
                after = (session.call_nodes[placement.parent]
                         if placement.kind == "next" and placement.parent is not None else None)
                call = ex.call(
                    c.prompt_ids, c.output_ids, c.logprobs, policy_version=version, finish_reason=c.finish_reason,
                    after=after, drift_checked=drift.checked, drift_at=drift.position,
                )
                session.call_nodes.append(call.output_node_id)
                self.placements.labels(placement.kind).inc()
                kinds.append((placement.kind, call))
        return kinds

    @staticmethod
    def _check_drift(session: Session, prompt_ids: Sequence[int]) -> DriftCheck:
        ctx, out = session.tree.contexts[-1], session.tree.outputs[-1]
        return check_drift(ctx[: len(ctx) - len(out)], out, prompt_ids)

    def finish(
        self, session_id: str, status: str, reward: float | None, partial_score: float | None
    ) -> list[PartialScore | ExecutionFinished]:
        """End a session's execution with ``status`` (and reward / partial score); returns its events."""
        if status not in FINISH_STATUSES:
            raise ValueError(f"status must be one of {', '.join(FINISH_STATUSES)}, got {status!r}")
        with self._lock:
            self.sessions.finish(session_id, status)
            ex = self.executions.pop(session_id)
            events: list[PartialScore | ExecutionFinished] = []
            if partial_score is not None:
                events.append(ex.score(partial_score))
            events.append(ex.finish(status, reward))
            self._keep_finished(session_id, ex)
            self.sessions_ended.labels(status).inc()
            return events

    def _keep_finished(self, session_id: str, ex: ExecutionRecorder) -> None:
        """Keep the last ``keep_finished`` finished executions, for score revisions."""
        self.finished[session_id] = ex
        while len(self.finished) > self.config.keep_finished:
            self.finished.popitem(last=False)

    def score(self, session_id: str, score: float, components: dict[str, float] | None, scorer: str,
              note: str) -> PartialScore:
        """A partial score (or a revision of it) of an open or recently finished session's execution."""
        if not isinstance(score, int | float) or isinstance(score, bool) or not math.isfinite(score):
            raise ValueError(f"score must be a finite number, got {score!r}")
        with self._lock:
            ex = self.executions.get(session_id) or self.finished.get(session_id)
            if ex is None:
                raise KeyError(f"no open or recently finished session {session_id!r} (the last "
                               f"{self.config.keep_finished} finished ones can be scored)")
            return ex.score(float(score), components=components, scorer=scorer, note=note)

    def expire_idle(self, now: float) -> list[str]:
        """End every session idle past the timeout as ``timeout``; returns their session ids."""
        with self._lock:
            ended = self.sessions.expire(now)
            for s in ended:
                ex = self.executions.pop(s.session_id, None)
                if ex is not None:
                    event = ex.finish("timeout")
                    self._keep_finished(s.session_id, ex)
                    if self.config.ack == "durable":
                        self.recorder.take_ack(event.event_id)  # nobody waits for it
                self.sessions_ended.labels("timeout").inc()
        return [s.session_id for s in ended]


_JSON = {"content-type": "application/json"}


def _error(status: int, message: str, kind: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind}}, status_code=status, headers=headers)


def _call_headers(kinds: list[tuple[str, ModelCall]]) -> dict[str, str]:
    return {
        "X-Sapwood-Placement": ",".join(k for k, _ in kinds),
        "X-Sapwood-Call-Id": ",".join(c.call_id for _, c in kinds),
    }


class NotAcknowledged(Exception):
    """A durable call's event was not acknowledged in time, or its delivery failed."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def create_app(config: GatewayConfig, transport: Transport, *, client: httpx.AsyncClient | None = None,
               ingest_lag: LagReader | None = None) -> FastAPI:
    """The gateway as an ASGI app; ``client`` (tests) replaces the upstream HTTP client; ``ingest_lag``
    reads the ingest's lag in records (needed with ``config.max_ingest_lag``).

    The gateway owns a background recorder in front of ``transport``; app shutdown drains it into
    ``transport`` (which stays open: the caller closes it)."""
    gw = Gateway(config, transport, ingest_lag)
    gw.recorder.lag_observer = gw.ack_lag.observe
    http = client or httpx.AsyncClient(
        timeout=httpx.Timeout(config.upstream_timeout_s),
        limits=httpx.Limits(max_connections=config.upstream_connections,
                            max_keepalive_connections=config.upstream_connections,
                            keepalive_expiry=config.upstream_keepalive_s),
    )
    retry_after = {"Retry-After": str(config.retry_after_s)}

    async def _expiry_loop() -> None:
        period = min(config.idle_timeout_s / 4, 5.0)
        while True:
            await asyncio.sleep(period)
            await asyncio.to_thread(gw.expire_idle, time.monotonic())

    async def _discover_tokenizer() -> None:
        """No --upstream-model-dir: the model folder the first upstream names in /v1/models, if readable here."""
        try:
            r = await http.get(config.upstreams[0] + "/v1/models", timeout=5.0)
            folder = folder_from_models(r.json()) if r.status_code == 200 else None
            if folder is not None:
                gw.tokenizer = tokenizer_metadata(folder)
                log.info("the upstream's tokenizer: %s", gw.tokenizer["tokenizer"])
        except (httpx.HTTPError, ValueError) as exc:
            log.info("no tokenizer from %s/v1/models: %s", config.upstreams[0], exc)

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        if not gw.tokenizer:
            await _discover_tokenizer()
        expiry = asyncio.create_task(_expiry_loop())
        if gw.lag_guard is not None:
            gw.lag_guard.start()
        yield
        expiry.cancel()
        if gw.lag_guard is not None:
            await asyncio.to_thread(gw.lag_guard.close)
        # every queued event reaches the transport, or shutdown fails naming how many did not
        await asyncio.to_thread(gw.recorder.close, config.drain_timeout_s)
        if gw.journal is not None:
            gw.journal.close()
        if client is None:
            await http.aclose()

    app = FastAPI(title="sapwood gateway", lifespan=lifespan)
    app.state.gateway = gw
    app.state.upstream_client = http  # its pool limits and keep-alive expiry are checked by tests

    async def _await_acks(kinds: Sequence[tuple[str, ModelCall | ExecutionFinished | PartialScore]]) -> None:
        """Durable mode: return once every call's event is acknowledged; :class:`NotAcknowledged` if not."""
        if config.ack != "durable":
            return
        futures = [gw.recorder.take_ack(call.event_id) for _, call in kinds]
        try:
            await asyncio.wait_for(asyncio.gather(*(asyncio.wrap_future(f) for f in futures)),
                                   config.durable_timeout_s)
        except TimeoutError:
            raise NotAcknowledged(
                f"the call was not acknowledged by the transport within {config.durable_timeout_s} s "
                "(it may still be stored); retry later", 429) from None
        except Exception as exc:
            raise NotAcknowledged(f"the call could not be recorded: {exc}", 502) from exc

    async def _send_upstream(
        route: Route, ref: SessionRef, up_body: dict[str, Any], stream: bool
    ) -> tuple[httpx.Response | None, str, str]:
        """POST to the session's upstream, retrying on a connection error or 5xx (same body), up to
        ``max_attempts`` tries: a 5xx on the next upstream (if there is another), a connection error on the
        next one round the list (with one upstream: the same one again; httpx drops the broken connection,
        so the retry gets another: a kept-alive connection the server closed as it was reused answers
        ``ReadError`` / ``RemoteProtocolError``). Returns the last response (None if none answered), its URL
        and the last error message (naming the exception's type: httpx's own text is often empty)."""
        order = upstream_order(config.upstreams, ref.session_id)
        content = json_codec.dumps(up_body)  # once: every attempt sends the same bytes
        resp: httpx.Response | None = None
        url, error = "", ""
        for k in range(config.max_attempts):
            url = order[k % len(order)] + ROUTE_PATHS[route]
            last = k == config.max_attempts - 1
            try:
                resp = await http.send(http.build_request("POST", url, content=content, headers=_JSON), stream=stream)
            except httpx.HTTPError as exc:
                text = str(exc) or "(no message)"
                resp, reason = None, "connection"
                error = f"upstream {url} unreachable after {k + 1} attempt(s): {type(exc).__name__}: {text}"
            else:
                if resp.status_code < 500 or last or k + 1 >= len(order):
                    return resp, url, ""
                await resp.aread()
                await resp.aclose()
                reason = "status"
            if not last:
                gw.retries.labels(reason).inc()
        return resp, url, error

    async def _proxy(request: Request, route: Route) -> Response:
        t0 = time.perf_counter()
        try:
            ref = resolve(request.url.path, dict(request.headers))
        except SessionError as exc:
            return _error(400, str(exc), "invalid_request_error")
        try:
            body = json_codec.loads(await request.body())
            up_body = upstream_body(route, body)
        except ValueError as exc:
            return _error(400, f"bad request body: {exc}", "invalid_request_error")
        admission = gw.admit()
        if not admission.ok:
            if not config.fail_open:
                gw.refused.labels(admission.reason).inc()
                return _error(429, f"recording is unavailable ({admission.reason.replace('_', ' ')}); "
                              f"retry after {config.retry_after_s} s", "rate_limit_error", retry_after)
            gw.unrecorded.labels(admission.reason).inc()
        recording = admission.ok
        try:
            if body.get("stream"):
                response = await _stream(ref, route, body, up_body, recording)
                recording = False  # the stream releases its admission when it ends
                return response
            return await _answer(ref, route, body, up_body, recording, t0)
        finally:
            if recording:
                gw.recorder.release()

    async def _answer(
        ref: SessionRef, route: Route, body: dict[str, Any], up_body: dict[str, Any], recording: bool, t0: float
    ) -> Response:
        upstream, url, error = await _send_upstream(route, ref, up_body, stream=False)
        if upstream is None:
            gw.calls.labels(route, "upstream_error").inc()
            return _error(502, error, "upstream_error")
        if upstream.status_code != 200:
            gw.calls.labels(route, "upstream_status").inc()
            return Response(
                upstream.content, status_code=upstream.status_code, media_type=upstream.headers.get("content-type")
            )
        try:
            answer = json_codec.loads(upstream.content)
            choices = answer_choices(route, body, answer)
        except (ValueError, MalformedAnswerError) as exc:
            gw.calls.labels(route, "malformed").inc()
            return _error(502, f"malformed upstream answer from {url}: {exc}", "upstream_error")
        headers: dict[str, str] = {}
        if recording:
            # on the loop: recording is short pure-Python work (it would hold the GIL in a worker thread too),
            # and the hop to a worker thread cost more than the work (bench_gateway --only cpu)
            kinds = gw.record(ref, choices, chat=route == "chat")
            try:
                await _await_acks(kinds)
            except NotAcknowledged as exc:
                gw.calls.labels(route, "not_acknowledged").inc()
                return _error(exc.status, str(exc), "recording_error", retry_after)
            headers = _call_headers(kinds)
            gw.calls.labels(route, "recorded").inc()
        else:
            gw.calls.labels(route, "unrecorded").inc()
        gw.latency.labels(route).observe(time.perf_counter() - t0)
        return json_codec.FastJSONResponse(stripped(route, body, answer), headers=headers)

    def _record_gathered(
        ref: SessionRef, route: Route, body: dict[str, Any], gather: StreamGather | GenerateGather, aborted: bool
    ) -> list[tuple[str, ModelCall]]:
        try:
            kinds = gw.record(ref, answer_choices(route, body, gather.answer(aborted=aborted)), chat=route == "chat")
        except MalformedAnswerError:
            gw.calls.labels(route, "malformed").inc()
            return []
        gw.calls.labels(route, "aborted" if aborted else "recorded").inc()
        return kinds

    async def _stream(
        ref: SessionRef, route: Route, body: dict[str, Any], up_body: dict[str, Any], recording: bool
    ) -> Response:
        def release() -> None:
            if recording:
                gw.recorder.release()

        upstream, _url, error = await _send_upstream(route, ref, up_body, stream=True)
        if upstream is None:
            release()
            gw.calls.labels(route, "upstream_error").inc()
            return _error(502, error, "upstream_error")
        if upstream.status_code != 200:
            release()
            content = await upstream.aread()
            await upstream.aclose()
            gw.calls.labels(route, "upstream_status").inc()
            return Response(content, status_code=upstream.status_code, media_type=upstream.headers.get("content-type"))
        gather: StreamGather | GenerateGather = GenerateGather() if route == "generate" else StreamGather(route)

        async def relay() -> AsyncIterator[str]:
            recorded = False
            try:
                async for line in upstream.aiter_lines():
                    chunk = parse_sse_data(line)
                    if chunk is not None:
                        gather.feed(chunk)
                        yield "data: " + json.dumps(stripped(route, body, chunk)) + "\n"
                        continue
                    if line.strip() == "data: [DONE]" and recording and not recorded:
                        recorded = True  # record (durable: and wait for the ack) before the client sees [DONE]
                        kinds = _record_gathered(ref, route, body, gather, False)
                        try:
                            await _await_acks(kinds)
                        except NotAcknowledged as exc:
                            yield "data: " + json.dumps({"error": {"message": str(exc), "type": "recording_error"}})
                            yield "\n\n"
                            return
                    yield line + "\n"
                if recording and not recorded:  # a stream that ended without [DONE]
                    recorded = True
                    _record_gathered(ref, route, body, gather, False)
            finally:
                await upstream.aclose()
                if recording and not recorded:  # client gone or upstream died: what arrived, as "abort"
                    kinds = _record_gathered(ref, route, body, gather, True)
                    if config.ack == "durable":
                        for _, call in kinds:
                            gw.recorder.take_ack(call.event_id)
                if not recording:
                    gw.calls.labels(route, "unrecorded").inc()
                release()

        return StreamingResponse(relay(), media_type="text/event-stream")

    async def completions(request: Request) -> Response:
        return await _proxy(request, "completions")

    async def chat(request: Request) -> Response:
        return await _proxy(request, "chat")

    async def generate(request: Request) -> Response:
        return await _proxy(request, "generate")

    for prefix in ("", "/s/{session}"):
        app.post(prefix + "/v1/completions")(completions)
        app.post(prefix + "/v1/chat/completions")(chat)
        app.post(prefix + "/generate")(generate)

        @app.get(prefix + "/v1/models")
        async def models() -> Response:
            r = await http.get(config.upstreams[0] + "/v1/models", timeout=5.0)
            return Response(r.content, status_code=r.status_code, media_type=r.headers.get("content-type"))

    @app.post("/v1/sessions/{session_id}/finish")
    async def finish(session_id: str, request: Request) -> Response:
        body = await request.json() if await request.body() else {}
        try:
            events = await asyncio.to_thread(
                gw.finish, session_id, body.get("status", "success"), body.get("reward"), body.get("partial_score")
            )
        except KeyError as exc:
            return _error(404, str(exc.args[0]), "not_found")
        except ValueError as exc:
            return _error(400, str(exc), "invalid_request_error")
        try:
            await _await_acks([("finish", e) for e in events])
        except NotAcknowledged as exc:
            return _error(exc.status, str(exc), "recording_error", retry_after)
        return JSONResponse({"session_id": session_id, "execution_id": events[-1].execution_id})

    @app.post("/v1/sessions/{session_id}/score")
    async def score(session_id: str, request: Request) -> Response:
        """A partial score, or its revision (also after finish): ``{"score", "components", "scorer", "note"}``."""
        body = await request.json() if await request.body() else {}
        if not isinstance(body, dict) or "score" not in body:
            return _error(400, 'body must be {"score": number, "components"?, "scorer"?, "note"?}',
                          "invalid_request_error")
        try:
            event = gw.score(session_id, body["score"], body.get("components"), str(body.get("scorer", "default")),
                             str(body.get("note", "")))
        except KeyError as exc:
            return _error(404, str(exc.args[0]), "not_found")
        except ValueError as exc:
            return _error(400, str(exc), "invalid_request_error")
        try:
            await _await_acks([("score", event)])
        except NotAcknowledged as exc:
            return _error(exc.status, str(exc), "recording_error", retry_after)
        return JSONResponse({"session_id": session_id, "execution_id": event.execution_id,
                             "revision": event.revision})

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {
            "status": "ok" if gw.recorder.failing is None else "recording_unavailable",
            "open_sessions": len(gw.sessions.open),
            "upstreams": config.upstreams,
            "ack": config.ack,
            "recorder_backlog": gw.recorder.backlog,
            "resumed_sessions": gw.resumed_sessions,
            "tokenizer": gw.tokenizer.get("tokenizer"),
            "ingest_lag": None if gw.lag_guard is None else gw.lag_guard.lag,
        }

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(gw.registry), media_type="text/plain; version=0.0.4")

    return app
