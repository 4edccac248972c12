"""ExecutionWriter: builds a consistent stream of TITO events for one execution.

It tracks the execution's tree (node lengths, prefix hash states, node tokens) so a model
call's input is sent as ``parent node + appended tokens + digest of the full input``. It only
builds events; recording them (Kafka or in-process) is the rollout recorder's job.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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
    new_event_id,
)
from sapwood.platform.tokens import TokenArray, as_logprobs, as_tokens, input_hasher, pack
from sapwood.platform.tree import match_prefix


@dataclass
class _WNode:
    parent: str | None
    tokens: TokenArray
    end: int
    state: Any
    role: str
    segment: int


class ExecutionWriter:
    """Event factory for one execution; ``events`` keeps everything it built, in order."""

    def __init__(
        self,
        *,
        run_id: str,
        task_id: str,
        task_family: str = "default",
        engine: str = "unknown",
        sampling_params: dict[str, Any] | None = None,
        vocab_size: int | None = None,
        execution_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        keep_events: bool = True,
        validate: bool = False,
    ) -> None:
        self.execution_id = execution_id or new_event_id()
        self.run_id = run_id
        self.task_id = task_id
        self.task_family = task_family
        self.engine = engine
        self.sampling_params = dict(sampling_params or {})
        self.vocab_size = vocab_size
        self.metadata = dict(metadata or {})
        self.keep_events = keep_events
        #: Validate each event before it takes a sequence number (an invalid one then leaves no gap).
        self.validate = validate
        self.events: list[Event] = []
        self.nodes: dict[str, _WNode] = {}
        #: parent node (None: context roots) → child node ids, in creation order.
        self.children: dict[str | None, list[str]] = {}
        self._seq = -1
        self._score_revision = -1
        self._continued: set[str] = set()
        self.finished = False
        #: The last context built (node id, its tokens, read-only): a chain's next context is built from it
        #: instead of walking back to the root (the walk is O(calls so far) per call).
        self._last_context: tuple[str, TokenArray] | None = None

    # -- bookkeeping --------------------------------------------------------------------------------
    def _next(self, event: Event) -> Event:
        if self.finished and not isinstance(event, PartialScore):
            raise SequenceError(f"execution {self.execution_id} is finished; cannot record {event.kind}")
        event.execution_id = self.execution_id
        event.seq = self._seq + 1
        if self.validate:
            event.validate()
            event.check_vocab(self.vocab_size)
        self._seq += 1
        if self.keep_events:
            self.events.append(event)
        return event

    def restore(self, event: Event) -> None:
        """Take back an event this execution recorded earlier (e.g. read from a journal after a crash), so
        the writer continues after it: the next sequence number, the tree's nodes, the score revision.
        Events must come in sequence order, from ``execution_started`` (seq 0) on."""
        if event.execution_id != self.execution_id or event.seq != self._seq + 1:
            raise SequenceError(f"restore: expected seq {self._seq + 1} of execution {self.execution_id}, "
                                f"got seq {event.seq} of {event.execution_id}")
        if self.finished and not isinstance(event, PartialScore):
            raise SequenceError(f"restore: execution {self.execution_id} is finished; got {event.kind}")
        self._seq = int(event.seq)
        self._grow(event)

    def _grow(self, event: Event) -> None:
        """What an event adds to the writer's state (tree nodes, revision, finished), once it has its seq."""
        if isinstance(event, Prompt):
            self._add(event.node_id, event.parent, event.token_ids, "prompt")
        elif isinstance(event, Observation):
            self._add(event.node_id, event.parent, event.token_ids, "observation")
        elif isinstance(event, ModelCall):
            in_node = event.parent
            if event.appended.size:
                in_node = event.input_node_id
                self._add(in_node or "", event.parent, event.appended, "prompt")
            self._add(event.output_node_id, in_node, event.output_ids, event.call_kind)
        elif isinstance(event, SegmentBoundary):
            segment = self._node(event.from_node, "compaction source").segment + 1
            self._continued.add(event.from_node)
            self._add(event.root_node_id, None, event.token_ids, "prompt", segment=segment)
        elif isinstance(event, PartialScore):
            self._score_revision = event.revision
        elif isinstance(event, ExecutionFinished):
            self.finished = True

    def _node(self, node_id: str, what: str) -> _WNode:
        node = self.nodes.get(node_id)
        if node is None:
            raise UnknownParentError(f"{what}: {node_id} is not a node of execution {self.execution_id}")
        return node

    def _add(self, node_id: str, parent: str | None, tokens: TokenArray, role: str, segment: int | None = None) -> None:
        p = self.nodes[parent] if parent else None
        state = p.state.copy() if p else input_hasher()
        state.update(pack(tokens))
        seg = segment if segment is not None else (p.segment if p else 0)
        self.nodes[node_id] = _WNode(parent, tokens, (p.end if p else 0) + int(tokens.size), state, role, seg)
        self.children.setdefault(parent, []).append(node_id)

    def context(self, node_id: str) -> TokenArray:
        """Tokens of the context ending at ``node_id``."""
        cached_id, cached = self._last_context or (None, np.zeros(0, dtype=np.int32))
        parts = []
        cur: str | None = node_id
        while cur is not None:
            if cur == cached_id:
                parts.append(cached)
                break
            node = self._node(cur, "context")
            parts.append(node.tokens)
            cur = node.parent
        if cur is not None and cur == node_id:
            return cached
        out = np.concatenate(parts[::-1]) if parts else np.zeros(0, dtype=np.int32)
        out.flags.writeable = False
        self._last_context = (node_id, out)
        return out

    def context_length(self, node_id: str) -> int:
        return self._node(node_id, "context").end

    def longest_prefix_node(self, tokens: TokenArray) -> tuple[str | None, int]:
        """Deepest node whose whole context is a prefix of ``tokens``: (node id or None, its length).

        The rule is :func:`sapwood.platform.tree.match_prefix` (the one apply uses for full-token
        calls); O(matched tokens).
        """

        def children(parent: str | None) -> list[tuple[str, int]]:
            return [(nid, int(self.nodes[nid].tokens.size)) for nid in reversed(self.children.get(parent, ()))]

        def matches(node_id: str, offset: int, length: int) -> bool:
            return bool(np.array_equal(tokens[offset : offset + length], self.nodes[node_id].tokens))

        return match_prefix(children, matches, int(tokens.size))

    # -- events ---------------------------------------------------------------------------------------
    def start(self) -> ExecutionStarted:
        if self._seq >= 0:
            raise SequenceError("start() must be the first event of an execution")
        ev = ExecutionStarted(run_id=self.run_id, task_id=self.task_id, task_family=self.task_family,
                              engine=self.engine, sampling_params=self.sampling_params,
                              vocab_size=self.vocab_size, metadata=self.metadata)
        return self._next(ev)  # type: ignore[return-value]

    def prompt(self, tokens: Any, *, parent: str | None = None, source: str = "prompt") -> Prompt:
        if parent:
            self._node(parent, "prompt parent")
        ev = Prompt(parent=parent, token_ids=as_tokens(tokens), source=source)
        self._next(ev)
        self._grow(ev)
        return ev

    def observe(self, parent: str, tokens: Any, *, source: str = "tool") -> Observation:
        self._node(parent, "observation parent")
        ev = Observation(parent=parent, token_ids=as_tokens(tokens), source=source)
        self._next(ev)
        self._grow(ev)
        return ev

    def call(
        self,
        parent: str | None,
        appended: Any,
        output_ids: Any,
        output_logprobs: Any,
        *,
        kind: str = "action",
        policy_version: int = 0,
        finish_reason: str = "stop",
        timings: dict[str, float] | None = None,
        sampling_params: dict[str, Any] | None = None,
        drift_checked: bool = False,
        drift_at: int | None = None,
    ) -> ModelCall:
        """Record a model call whose input is ``context(parent) + appended`` (drift: :class:`ModelCall`)."""
        app = as_tokens(appended, name="appended input")
        out = as_tokens(output_ids, name="output ids")
        lps = as_logprobs(output_logprobs, name="output log-probs")
        if out.size != lps.size:
            raise LengthMismatchError(f"{out.size} output ids but {lps.size} log-probs; expected equal lengths")
        if parent is None and app.size == 0:
            raise ValidationError("a model call needs a non-empty input")
        state = self._node(parent, "call parent").state.copy() if parent else input_hasher()
        state.update(pack(app))
        ev = ModelCall(call_kind=kind, parent=parent, appended=app, input_digest=state.hexdigest(),  # type: ignore[arg-type]
                       output_ids=out, output_logprobs=lps, policy_version=policy_version,
                       finish_reason=finish_reason, timings=dict(timings or {}), sampling_params=sampling_params,
                       drift_checked=drift_checked, drift_at=drift_at)
        self._next(ev)
        self._grow(ev)
        return ev

    def fork(self, at_node: str, branches: int, *, reason: str = "resample") -> Fork:
        self._node(at_node, "fork point")
        ev = Fork(at_node=at_node, branches=branches, reason=reason)
        return self._next(ev)  # type: ignore[return-value]

    def compact(self, from_node: str, context_tokens: Any) -> SegmentBoundary:
        """Start a new segment whose context is ``context_tokens``, continuing summary ``from_node``."""
        src = self._node(from_node, "compaction source")
        if src.role != "summary":
            raise ValidationError(f"compaction must follow a summary call's output, {from_node} is {src.role}")
        ev = SegmentBoundary(from_node=from_node, token_ids=as_tokens(context_tokens))
        self._next(ev)
        self._grow(ev)
        return ev

    def score(self, score: float, *, components: dict[str, float] | None = None, scorer: str = "default",
              note: str = "") -> PartialScore:
        ev = PartialScore(score=score, components=dict(components or {}), scorer=scorer,
                          revision=self._score_revision + 1, note=note)
        self._next(ev)
        self._grow(ev)
        return ev

    def finish(self, status: str = "success", reward: float | None = None, *,
               leaf_rewards: dict[str, float] | None = None, message: str = "") -> ExecutionFinished:
        ev = ExecutionFinished(status=status, reward=reward, leaf_rewards=dict(leaf_rewards or {}),  # type: ignore[arg-type]
                               message=message)
        self._next(ev)
        self._grow(ev)
        return ev

    def leaves(self) -> list[str]:
        """Current leaf nodes (no child, not continued by a later segment)."""
        inner = {n.parent for n in self.nodes.values() if n.parent}
        inner |= self._continued
        return [nid for nid in self.nodes if nid not in inner]
