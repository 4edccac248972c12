"""One handler per event class: check the event against the planned state, then record its effects.

Handlers are dispatched on the event's class with :func:`functools.singledispatch`
(:func:`plan_event`); :func:`handler_for` resolves a class's handler once and refuses a class no
handler is registered for. A handler gets the event, the batch's :class:`Planning` (the
:class:`~.batch.BatchPlanner`), the row of the event's execution (None for events outside executions
and for ``execution_started``) and the event's array references to fill (:data:`~.span_effects.Refs`);
it returns overrides of the stored event body (or None). Every check runs before the first effect.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from sapwood.platform.errors import ConflictError, DigestMismatchError, SequenceError, ValidationError
from sapwood.platform.events import (
    CellHeartbeat,
    CellRegistered,
    Event,
    ExecutionFinished,
    ExecutionStarted,
    Fork,
    ModelCall,
    Observation,
    PartialScore,
    PolicyPublished,
    Prompt,
    RoleAssigned,
    SegmentBoundary,
    SwitchPhase,
)
from sapwood.platform.planner import cells
from sapwood.platform.planner.cells import CellEffects
from sapwood.platform.planner.executions import ExecutionLedger, count_call
from sapwood.platform.planner.ports import Row, StoredState
from sapwood.platform.planner.results import Hasher
from sapwood.platform.planner.span_effects import Refs, SpanEffects
from sapwood.platform.planner.tree_effects import TreeEffects, root_state
from sapwood.platform.tree import ROLE_NAMES, NodeRecord, Role


class Planning(Protocol):
    """What a handler reads and adds to: the batch planner's effects (:class:`~.batch.BatchPlanner` is one)."""

    state: StoredState
    spans: SpanEffects
    tree: TreeEffects
    executions: ExecutionLedger
    cells: CellEffects
    calls: list[Row]
    segments: list[Row]
    scores: list[Row]
    policy_versions: list[Row]
    policy_keys: set[tuple[str, int]]

    def add_node(self, event: Event, st: Row, refs: Refs, *, node_id: str, parent: NodeRecord | None, role: Role,
                 name: str, tokens: np.ndarray, state: Hasher, segment: int | None = None,
                 prev_segment_node: str | None = None, call_id: str | None = None,
                 policy_version: int | None = None) -> NodeRecord:
        """Record a node of ``tokens`` and count it in execution row ``st``."""
        ...

Overrides = dict[str, Any] | None
"""Values replacing fields of the stored event body (None: the event's own fields)."""

Handler = Callable[[Any, Planning, Row | None, Refs], Overrides]
"""``handler(event, planner, execution row or None, refs)`` → overrides of the stored body."""


@functools.singledispatch
def plan_event(event: Event, plan: Planning, st: Row | None, refs: Refs) -> Overrides:
    """Check ``event`` and record its effects in ``plan`` (dispatched on the event's class)."""
    raise _unknown(type(event))


def _unknown(cls: type) -> ValidationError:
    known = sorted(c.kind for c in plan_event.registry if isinstance(c, type) and issubclass(c, Event)
                   and c is not Event)
    return ValidationError(
        f"apply has no handler for event type {cls.__module__}.{cls.__qualname__} "
        f"(kind {getattr(cls, 'kind', '?')!r}); expected one of the kinds {', '.join(known)}"
    )


_FALLBACK = plan_event.dispatch(object)


def handler_for(cls: type) -> Handler:
    """The handler of events of class ``cls``; raises :class:`ValidationError` when there is none."""
    handler = plan_event.dispatch(cls)
    if handler is _FALLBACK:
        raise _unknown(cls)
    return handler


def _scoped(st: Row | None) -> Row:
    assert st is not None, "an execution-scoped event's row is checked before its handler"
    return st


@plan_event.register(ExecutionStarted)
def _started(e: ExecutionStarted, plan: Planning, st: Row | None, refs: Refs) -> Overrides:
    plan.executions.start(e)
    return None


@plan_event.register(Prompt)
def _prompt(e: Prompt, plan: Planning, st: Row | None, refs: Refs) -> Overrides:
    st = _scoped(st)
    tree = plan.tree
    parent = tree.node(e.parent, st["execution_id"], "prompt parent") if e.parent else None
    tree.check_new(e.node_id, e)
    tokens = np.ascontiguousarray(e.token_ids)
    state = tree.child_state(parent.node_id, tokens.data) if parent is not None else root_state(tokens)
    plan.add_node(e, st, refs, node_id=e.node_id, parent=parent, role=Role.PROMPT, name="token_ids",
                  tokens=tokens, state=state)
    return None


@plan_event.register(Observation)
def _observation(e: Observation, plan: Planning, st: Row | None, refs: Refs) -> Overrides:
    st = _scoped(st)
    tree = plan.tree
    parent = tree.node(e.parent, st["execution_id"], "observation parent")
    tree.check_new(e.node_id, e)
    tokens = np.ascontiguousarray(e.token_ids)
    plan.add_node(e, st, refs, node_id=e.node_id, parent=parent, role=Role.OBSERVATION, name="token_ids",
                  tokens=tokens, state=tree.child_state(parent.node_id, tokens.data))
    return None


@plan_event.register(ModelCall)
def _call(e: ModelCall, plan: Planning, st: Row | None, refs: Refs) -> Overrides:
    st = _scoped(st)
    exec_id: str = st["execution_id"]
    tree = plan.tree
    appended = e.appended
    event_input_id, output_id = e.input_node_id, e.output_node_id
    parent: NodeRecord | None
    if e.parent is not None:
        parent = tree.node(e.parent, exec_id, "model_call parent")
        full_len = parent.end + int(appended.size)
        state = tree.child_state(e.parent, np.ascontiguousarray(appended).data)
        input_node_id = event_input_id
    else:
        # Full input: verify directly, then share whatever whole nodes already exist.
        state = root_state(appended)
        full_len = int(appended.size)
        matched, offset = tree.match_whole_nodes(exec_id, appended)
        parent = tree.node(matched, exec_id, "full-token call prefix") if matched else None
        appended = appended[offset:]
        input_node_id = event_input_id if appended.size else matched
    digest = state.hexdigest()
    if digest != e.input_digest:
        raise DigestMismatchError(
            f"model_call {e.event_id}: input digest {e.input_digest} does not match the input "
            f"reconstructed from the tree ({digest}, {full_len} tokens); expected the BLAKE2b-128 of "
            "the exact input ids",
            event_id=e.event_id,
        )
    if e.drift_at is not None and e.drift_at > full_len:  # a prompt may stop inside the output: at the end
        raise ValidationError(f"model_call {e.event_id}: drift_at {e.drift_at} is past the end of its input "
                              f"({full_len} tokens)", event_id=e.event_id)
    if appended.size:
        tree.check_new(event_input_id or "", e)
    tree.check_new(output_id, e)
    # -- effects
    if appended.size:
        input_parent = plan.add_node(e, st, refs, node_id=event_input_id or "", parent=parent, role=Role.PROMPT,
                                     name="appended", tokens=appended, state=state)
    else:
        refs["appended"] = [None, 0]
        assert parent is not None
        input_parent = parent
    output = np.ascontiguousarray(e.output_ids)
    out_state = state.copy()
    out_state.update(output.data)
    plan.add_node(e, st, refs, node_id=output_id, parent=input_parent,
                  role=Role.SUMMARY if e.call_kind == "summary" else Role.ACTION, name="output_ids",
                  tokens=output, state=out_state, call_id=e.event_id, policy_version=e.policy_version)
    lp_digest = plan.spans.add(refs, "output_logprobs", e.output_logprobs)
    plan.calls.append({
        "call_id": e.event_id,
        "execution_id": exec_id,
        "seq": e.seq,
        "call_kind": e.call_kind,
        "segment": input_parent.segment,
        "input_node": input_node_id or input_parent.node_id,
        "input_len": full_len,
        "input_digest": e.input_digest,
        "output_node": output_id,
        "n_output": int(output.size),
        "logprobs_digest": lp_digest,
        "policy_version": e.policy_version,
        "finish_reason": e.finish_reason,
        "timings": e.timings,
        "sampling_params": e.sampling_params,
        "created_at": e.created_at,
        "drift_checked": e.drift_checked,
        "drift_at": e.drift_at,
    })
    count_call(st, input_len=full_len, n_output=int(output.size), policy_version=e.policy_version)
    # Stored normalized when the full input was sent: the matched node as parent, only the rest as tokens.
    return {"parent": parent.node_id if parent else None} if e.parent is None else None


@plan_event.register(Fork)
def _fork(e: Fork, plan: Planning, st: Row | None, refs: Refs) -> Overrides:
    st = _scoped(st)
    plan.tree.node(e.at_node, st["execution_id"], "fork point")
    plan.tree.update(e.at_node, {"fork_branches": e.branches})
    st["n_forks"] += 1
    return None


@plan_event.register(SegmentBoundary)
def _segment(e: SegmentBoundary, plan: Planning, st: Row | None, refs: Refs) -> Overrides:
    st = _scoped(st)
    src = plan.tree.node(e.from_node, st["execution_id"], "segment_boundary.from_node")
    if src.role != Role.SUMMARY:
        raise ValidationError(
            f"segment_boundary.from_node {e.from_node} is a {ROLE_NAMES[src.role]} node; expected the "
            "output node of a summary call",
            event_id=e.event_id,
        )
    plan.tree.check_new(e.root_node_id, e)
    segment = src.segment + 1
    tokens = np.ascontiguousarray(e.token_ids)
    plan.add_node(e, st, refs, node_id=e.root_node_id, parent=None, role=Role.PROMPT, name="token_ids",
                  tokens=tokens, state=root_state(tokens), segment=segment, prev_segment_node=e.from_node)
    plan.segments.append({"root_node": e.root_node_id, "execution_id": e.execution_id,
                          "segment": segment, "from_node": e.from_node, "seq": e.seq})
    st["n_segments"] = max(st["n_segments"], segment + 1)
    return None


@plan_event.register(ExecutionFinished)
def _finished(e: ExecutionFinished, plan: Planning, st: Row | None, refs: Refs) -> Overrides:
    st = _scoped(st)
    for node_id in e.leaf_rewards:
        plan.tree.node(node_id, st["execution_id"], "leaf_rewards key")
    st.update(status=e.status, reward=e.reward, leaf_rewards=dict(e.leaf_rewards), message=e.message,
              finished_at=e.created_at)
    return None


@plan_event.register(PartialScore)
def _score(e: PartialScore, plan: Planning, st: Row | None, refs: Refs) -> Overrides:
    st = _scoped(st)
    expected = 0 if st["score_revision"] is None else st["score_revision"] + 1
    if e.revision != expected:
        raise SequenceError(
            f"partial_score revision {e.revision} for execution {e.execution_id}; expected {expected}",
            event_id=e.event_id,
        )
    plan.scores.append({"event_id": e.event_id, "execution_id": e.execution_id, "revision": e.revision,
                        "score": float(e.score), "components": e.components, "scorer": e.scorer,
                        "note": e.note, "created_at": e.created_at})
    st.update(score=float(e.score), score_revision=e.revision)
    return None


@plan_event.register(PolicyPublished)
def _policy(e: PolicyPublished, plan: Planning, st: Row | None, refs: Refs) -> Overrides:
    key = (e.run_id, e.version)
    if key in plan.policy_keys or plan.state.policy_version_exists(e.run_id, e.version):
        raise ConflictError(f"policy version {e.version} of run {e.run_id} was already published")
    plan.policy_keys.add(key)
    plan.policy_versions.append({"run_id": e.run_id, "version": e.version, "event_id": e.event_id,
                                 "checkpoint": e.checkpoint, "metadata": e.metadata,
                                 "published_at": e.created_at})
    return None


def _cell_handler(effect: Callable[[cells.CellEffects, Any], None]) -> Handler:
    """A handler running ``effect`` (a function of :mod:`.cells`) on the planner's cell effects."""

    def handle(e: Event, plan: Planning, st: Row | None, refs: Refs) -> Overrides:
        effect(plan.cells, e)
        return None

    return handle


for _cls, _effect in ((CellRegistered, cells.registered), (CellHeartbeat, cells.heartbeat),
                      (RoleAssigned, cells.role_assigned), (SwitchPhase, cells.switch_phase)):
    plan_event.register(_cls, _cell_handler(_effect))


__all__ = ["Handler", "Overrides", "Planning", "handler_for", "plan_event"]
