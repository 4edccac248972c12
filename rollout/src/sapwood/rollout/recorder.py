"""The TITO recorder: what a rollout worker wraps around its engine calls.

One line per model call::

    recorder = Recorder(make_transport(), run_id="run-7", engine="sglang", vocab_size=151_936)
    with recorder.start("task-42", prompt=system_and_task_ids) as ex:
        while not done:
            out = engine.generate(input_ids)
            ex.call(input_ids, out.ids, out.logprobs, policy_version=out.version)
            ex.observe(tool_result_ids)
            input_ids = ...                      # whatever the engine sees next, exactly
        ex.finish("success", reward=1.0)
    recorder.close()

The recorder keeps the execution's tree (on :class:`~sapwood.platform.writer.ExecutionWriter`)
and sends each input as *deepest known node whose context prefixes it + appended tokens +
digest of the full input*; an input that extends no known node goes as full tokens. Inputs,
prompts and observations longer than the transport's event limit are split into chained
prompt/observation events, so no event exceeds ``max_event_bytes``.

Inconsistent use raises at once, before anything is sent: output/log-prob length mismatch
(:class:`LengthMismatchError`), recording after ``finish`` (:class:`SequenceError`), an unknown
fork point or node (:class:`UnknownParentError`), an invalid event (:class:`ValidationError`).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence
from types import TracebackType
from typing import Any, Protocol, Self, TypeVar

import numpy as np

from sapwood.platform.errors import LengthMismatchError, SequenceError, UnknownParentError, ValidationError
from sapwood.platform.events import (
    Event,
    ExecutionFinished,
    ExecutionStarted,
    Fork,
    ModelCall,
    Observation,
    PartialScore,
    Prompt,
    SegmentBoundary,
)
from sapwood.platform.faults import fault_point
from sapwood.platform.run_ids import check_run_id
from sapwood.platform.tokens import TokenArray, as_logprobs, as_tokens
from sapwood.platform.writer import ExecutionWriter
from sapwood.rollout.transports import (
    DeliveryError,
    EventTooLargeError,
    MemoryTransport,
    Transport,
    TransportError,
)

#: Bytes reserved for an event's JSON header when sizing token chunks.
HEADER_ALLOWANCE = 64 * 1024
#: A node id, or an event that created one (call → its output, observation/prompt → its node,
#: segment boundary → the new segment's root).
NodeRef = str | Event

Lease = TypeVar("Lease", covariant=True)


class PromptSource(Protocol[Lease]):
    """Where prompt samples are claimed from (:class:`sapwood.rollout.prompts.PromptClient` is one)."""

    def claim(self, recorder: Recorder | None = None) -> Lease | None: ...


class Recorder:
    """Starts :class:`ExecutionRecorder` s that share one transport and one run's settings.

    Thread-safe: run one execution per worker thread on a shared recorder.
    """

    def __init__(
        self,
        transport: Transport | None = None,
        *,
        run_id: str,
        engine: str = "unknown",
        vocab_size: int | None = None,
        sampling_params: dict[str, Any] | None = None,
        task_family: str = "default",
    ) -> None:
        self.transport = transport if transport is not None else MemoryTransport()
        self.run_id = check_run_id(run_id)  # the API's rule: every recorded run can be opened by id
        self.engine = engine
        self.vocab_size = vocab_size
        self.sampling_params = dict(sampling_params or {})
        self.task_family = task_family
        self._broken: dict[str, BaseException] = {}
        self._lock = threading.Lock()

    def start(
        self,
        task_id: str,
        *,
        prompt: Any = None,
        task_family: str | None = None,
        metadata: dict[str, Any] | None = None,
        sampling_params: dict[str, Any] | None = None,
        execution_id: str | None = None,
    ) -> ExecutionRecorder:
        """Start an execution of ``task_id`` (optionally with its first prompt tokens)."""
        ex = ExecutionRecorder(self, task_id=task_id, task_family=task_family or self.task_family,
                               metadata=metadata, execution_id=execution_id,
                               sampling_params=self.sampling_params if sampling_params is None else sampling_params)
        if prompt is not None:
            ex.prompt(prompt, source="prompt")
        return ex

    def resume(self, events: Sequence[Event]) -> ExecutionRecorder:
        """Continue an execution recorded earlier, from its events in sequence order (``execution_started``
        first, e.g. read back from a journal after a crash): nothing is sent again; the next event takes
        the next sequence number and the tree holds every node the events made."""
        if not events or not isinstance(events[0], ExecutionStarted):
            raise SequenceError("resume needs the execution's events from its execution_started on")
        start = events[0]
        return ExecutionRecorder(self, task_id=start.task_id, task_family=start.task_family, metadata=start.metadata,
                               execution_id=start.execution_id, sampling_params=start.sampling_params,
                               resumed=events)

    def claim_prompt(self, prompts: PromptSource[Lease]) -> Lease | None:
        """Claim the next prompt sample of ``prompts``' run under a lease (None when none is available);
        :meth:`~sapwood.rollout.prompts.PromptLease.start` then starts its execution on this recorder."""
        return prompts.claim(self)

    # -- delivery failures --------------------------------------------------------------------------
    def _note_failures(self, exc: DeliveryError) -> None:
        with self._lock:
            for event, error in exc.failures:
                if event.execution_id:
                    self._broken.setdefault(event.execution_id, error)

    def broken(self, execution_id: str) -> BaseException | None:
        """The delivery error that broke ``execution_id`` (an event of it was lost), if any."""
        with self._lock:
            return self._broken.get(execution_id)

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every recorded event is delivered; raise :class:`DeliveryError` on failures."""
        try:
            self.transport.flush(timeout)
        except DeliveryError as exc:
            self._note_failures(exc)
            raise

    def close(self, timeout: float | None = None) -> None:
        """Flush and close the transport."""
        try:
            self.transport.close(timeout)
        except DeliveryError as exc:
            self._note_failures(exc)
            raise

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc is None:
            self.close()
        else:
            self.transport.__exit__(exc_type, exc, tb)


class ExecutionRecorder:
    """Records one execution; not thread-safe (one worker drives one execution).

    ``head`` is the node the next observation or prompt attaches to by default: the output
    of the last call, the last observation/prompt, or a new segment's root.
    """

    def __init__(self, recorder: Recorder, *, task_id: str, task_family: str, metadata: dict[str, Any] | None,
                 execution_id: str | None, sampling_params: dict[str, Any],
                 resumed: Sequence[Event] = ()) -> None:
        self._rec = recorder
        self._writer = ExecutionWriter(
            run_id=recorder.run_id, task_id=task_id, task_family=task_family, engine=recorder.engine,
            sampling_params=sampling_params, vocab_size=recorder.vocab_size, execution_id=execution_id,
            metadata=metadata, keep_events=False, validate=True,
        )
        self.execution_id = self._writer.execution_id
        self.head: str | None = None
        self.last_summary: str | None = None
        self.n_calls = 0
        self._unsent: deque[Event] = deque()
        limit = recorder.transport.max_event_bytes
        #: Most token ids one event may carry (None: unlimited).
        self.max_event_tokens = None if limit is None else max(1, (limit - min(HEADER_ALLOWANCE, limit // 4)) // 4)
        if resumed:  # Recorder.resume: take the events back, send nothing
            self._restore(resumed)
            return
        self._queue(self._writer.start())
        self.resend()

    def _restore(self, events: Sequence[Event]) -> None:
        for event in events:
            self._writer.restore(event)
            if isinstance(event, ModelCall):
                self.head = event.output_node_id
                self.n_calls += 1
                if event.call_kind == "summary":
                    self.last_summary = event.output_node_id
            elif isinstance(event, Prompt | Observation):
                self.head = event.node_id
            elif isinstance(event, SegmentBoundary):
                self.head = event.root_node_id

    # -- plumbing -----------------------------------------------------------------------------------
    @property
    def finished(self) -> bool:
        return self._writer.finished

    @property
    def writer(self) -> ExecutionWriter:
        """The underlying event builder (tree, node tokens)."""
        return self._writer

    def _queue(self, event: Event) -> None:
        self._unsent.append(event)

    def resend(self) -> None:
        """Hand over recorded events not yet accepted by the transport, in order.

        Recording and sending are separate: when the transport refuses for a while (e.g.
        :class:`~sapwood.rollout.transports.BackpressureTimeout`) the event stays recorded and
        goes out before the next one — do not record it again.
        """
        while self._unsent:
            try:
                self._rec.transport.send(self._unsent[0])
            except DeliveryError as exc:  # ours was accepted; earlier ones (maybe of others) failed
                self._unsent.popleft()
                self._rec._note_failures(exc)
            else:
                self._unsent.popleft()
        self._check_delivery()

    def _check_delivery(self) -> None:
        error = self._rec.broken(self.execution_id)
        if error is not None:
            raise TransportError(
                f"execution {self.execution_id} lost an event in delivery ({error}); the store will reject the "
                "rest of it (sequence gap): record this attempt as a new execution"
            )

    def _ready(self) -> None:
        if self._unsent:
            self.resend()
        else:
            self._check_delivery()

    def node(self, ref: NodeRef | None) -> str:
        """Resolve a node reference (None: the head) to a node id of this execution."""
        if ref is None:
            if self.head is None:
                raise SequenceError("no current node yet: record a prompt or a call first")
            return self.head
        if isinstance(ref, ModelCall):
            node_id = ref.output_node_id
        elif isinstance(ref, Prompt | Observation):
            node_id = ref.node_id
        elif isinstance(ref, SegmentBoundary):
            node_id = ref.root_node_id
        elif isinstance(ref, str):
            node_id = ref
        else:
            raise UnknownParentError(f"cannot use a {type(ref).__name__} as a node of the execution tree")
        if node_id not in self._writer.nodes:
            raise UnknownParentError(f"{node_id} is not a node of execution {self.execution_id}")
        return node_id

    def context(self, ref: NodeRef | None = None) -> TokenArray:
        """Token ids of the context ending at ``ref`` (default: the head)."""
        return self._writer.context(self.node(ref))

    def _chunks(self, tokens: TokenArray) -> list[TokenArray]:
        limit = self.max_event_tokens
        if limit is None or tokens.size <= limit:
            return [tokens]
        return [tokens[i : i + limit] for i in range(0, int(tokens.size), limit)]

    def _append(self, tokens: TokenArray, parent: str | None, kind: str, source: str) -> Prompt | Observation:
        """Emit ``tokens`` after ``parent`` as one or more chained prompt/observation events."""
        if tokens.size == 0:
            raise ValidationError(f"{kind}: no tokens to record")
        ev: Prompt | Observation | None = None
        for chunk in self._chunks(tokens):
            if kind == "observation":
                assert parent is not None
                ev = self._writer.observe(parent, chunk, source=source)
            else:
                ev = self._writer.prompt(chunk, parent=parent, source=source)
            self._queue(ev)
            parent = ev.node_id
        assert ev is not None
        self.head = ev.node_id
        self.resend()
        return ev

    # -- recording ----------------------------------------------------------------------------------
    def prompt(self, tokens: Any, *, after: NodeRef | None = None, source: str = "prompt") -> Prompt | Observation:
        """Prompt tokens (system prompt, task, template) after ``after`` (default: head; none → new root)."""
        self._ready()
        parent = self.node(after) if after is not None or self.head is not None else None
        return self._append(as_tokens(tokens, name="prompt tokens"), parent, "prompt", source)

    def observe(self, tokens: Any, *, after: NodeRef | None = None, source: str = "tool") -> Prompt | Observation:
        """Tool/environment tokens after ``after`` (default: head, usually the last call's output)."""
        self._ready()
        return self._append(as_tokens(tokens, name="observation tokens"), self.node(after), "observation", source)

    def call(
        self,
        input_ids: Any,
        output_ids: Any,
        output_logprobs: Any,
        *,
        policy_version: int = 0,
        kind: str = "action",
        finish_reason: str = "stop",
        timings: dict[str, float] | None = None,
        sampling_params: dict[str, Any] | None = None,
        after: NodeRef | None = None,
        drift_checked: bool = False,
        drift_at: int | None = None,
    ) -> ModelCall:
        """Record one engine call: the exact ``input_ids`` it saw, its output ids and rollout log-probs.

        The input is matched against the tree: the deepest node whose context prefixes it
        becomes the parent (``after`` pins it: the input must then start with that node's
        context). ``drift_checked`` / ``drift_at``: the retokenization drift check of a chat call
        (:class:`ModelCall`). Returns the :class:`ModelCall` event (``call_id``, ``output_node_id``).
        """
        self._ready()
        ids = as_tokens(input_ids, name="input_ids")
        out = as_tokens(output_ids, name="output_ids")
        lps = as_logprobs(output_logprobs, name="output_logprobs")
        if out.size != lps.size:
            raise LengthMismatchError(
                f"{out.size} output ids but {lps.size} log-probs; expected one rollout log-prob per output token"
            )
        if ids.size == 0:
            raise ValidationError("input_ids must not be empty")
        if self.max_event_tokens is not None and 2 * out.size > self.max_event_tokens:
            raise EventTooLargeError(
                f"{out.size} output tokens (+ log-probs) exceed one event's limit "
                f"({self.max_event_tokens // 2} tokens for max_event_bytes={self._rec.transport.max_event_bytes})"
            )
        if after is not None:
            parent: str | None = self.node(after)
            offset = self._writer.context_length(parent or "")
            if ids.size < offset or not np.array_equal(ids[:offset], self._writer.context(parent or "")):
                raise ValidationError(f"input_ids do not start with the context of node {parent} ({offset} tokens)")
        else:
            parent, offset = self._writer.longest_prefix_node(ids)
        chunks = self._chunks(ids[offset:])
        if len(chunks) > 1:  # validate the call before its input chunks go out
            ModelCall(call_kind=kind, parent=parent, appended=chunks[-1], input_digest="0" * 32, output_ids=out,  # type: ignore[arg-type]
                      output_logprobs=lps, policy_version=policy_version, execution_id=self.execution_id,
                      seq=1).validate()
            for chunk in chunks[:-1]:
                ev = self._writer.prompt(chunk, parent=parent, source="input")
                self._queue(ev)
                parent = ev.node_id
        call = self._writer.call(parent, chunks[-1], out, lps, kind=kind, policy_version=policy_version,
                                 finish_reason=finish_reason, timings=timings, sampling_params=sampling_params,
                                 drift_checked=drift_checked, drift_at=drift_at)
        self._queue(call)
        self.head = call.output_node_id
        self.n_calls += 1
        if kind == "summary":
            self.last_summary = call.output_node_id
        self.resend()
        fault_point("rollout.mid_recording")
        return call

    def fork(self, branches: int = 2, *, at: NodeRef | None = None, reason: str = "resample") -> Fork:
        """The state after ``at`` (default: head) is continued ``branches`` ways."""
        self._ready()
        ev = self._writer.fork(self.node(at), branches, reason=reason)
        self._queue(ev)
        self.resend()
        return ev

    def compact(self, context_ids: Any, *, summary: NodeRef | None = None) -> SegmentBoundary:
        """Start a new segment whose fresh context is ``context_ids`` (task prompt + summary, typically).

        ``summary`` is the summary call it continues (default: the last one recorded).
        """
        self._ready()
        if summary is None:
            if self.last_summary is None:
                raise SequenceError("compact() must follow a model call with kind='summary'")
            from_node = self.last_summary
        else:
            from_node = self.node(summary)
        tokens = as_tokens(context_ids, name="context_ids")
        if self.max_event_tokens is not None and tokens.size > self.max_event_tokens:
            raise EventTooLargeError(f"a compacted context of {tokens.size} tokens exceeds one event's limit "
                                     f"({self.max_event_tokens} tokens)")
        ev = self._writer.compact(from_node, tokens)
        self._queue(ev)
        self.head = ev.root_node_id
        self.resend()
        return ev

    def score(self, score: float, *, components: dict[str, float] | None = None, scorer: str = "default",
              note: str = "") -> PartialScore:
        """A partial score (e.g. fraction of tests passing); allowed after finish, revisions count up."""
        self._ready()
        ev = self._writer.score(score, components=components, scorer=scorer, note=note)
        self._queue(ev)
        self.resend()
        return ev

    def finish(self, status: str = "success", reward: float | None = None, *,
               leaf_rewards: dict[NodeRef, float] | None = None, message: str = "") -> ExecutionFinished:
        """End the execution: ``success`` / ``timeout`` / ``error`` with its final reward (None: unscored)."""
        self._ready()
        leaves = {self.node(k): float(v) for k, v in (leaf_rewards or {}).items()}
        ev = self._writer.finish(status, reward, leaf_rewards=leaves, message=message)
        self._queue(ev)
        self.resend()
        return ev

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        """Finish with ``error`` if the block raised (or forgot to finish)."""
        if self.finished:
            return
        message = f"{exc_type.__name__}: {exc}" if exc_type else "execution block exited without finish()"
        try:
            self.finish("error", message=message[:2000])
        except Exception:
            if exc is None:
                raise


__all__ = ["ExecutionRecorder", "NodeRef", "Recorder"]
