"""The trajectory tree's events (execution start, prompts, observations, model calls, forks,
compaction boundaries, finish and partial scores) and the learner's ``policy_published``."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from sapwood.platform.errors import DTypeError, LengthMismatchError, ValidationError
from sapwood.platform.events.base import (
    CALL_KINDS,
    FINISH_STATUSES,
    CallKind,
    Event,
    FinishStatus,
    UnscopedEvent,
    _empty_logprobs,
    _empty_tokens,
    derive_node_id,
)
from sapwood.platform.run_ids import check_run_id
from sapwood.platform.tokens import MAX_LOGPROB, FloatArray, TokenArray

__all__ = [
    "ExecutionFinished",
    "ExecutionStarted",
    "Fork",
    "ModelCall",
    "Observation",
    "PartialScore",
    "PolicyPublished",
    "Prompt",
    "SegmentBoundary",
]


@dataclass(eq=False, kw_only=True)
class ExecutionStarted(Event):
    """One attempt at one task begins."""

    kind: ClassVar[str] = "execution_started"

    run_id: str
    task_id: str
    task_family: str = "default"
    engine: str = "unknown"
    sampling_params: dict[str, Any] = field(default_factory=dict)
    vocab_size: int | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    def _validate(self) -> None:
        if self.seq != 0:
            raise ValidationError(
                f"execution_started must have seq 0, got {self.seq}", event_id=self.event_id
            )
        if self.vocab_size is not None and (not isinstance(self.vocab_size, int) or self.vocab_size <= 0):
            raise ValidationError(f"vocab_size must be a positive integer, got {self.vocab_size!r}")
        if not self.run_id or not self.task_id:
            raise ValidationError("execution_started needs non-empty run_id and task_id")
        try:
            check_run_id(self.run_id)
        except ValidationError as exc:
            raise ValidationError(f"execution_started.run_id: {exc}", event_id=self.event_id) from None


@dataclass(eq=False, kw_only=True)
class Prompt(Event):
    """Prompt tokens appended to a context (system prompt, task statement, template); not trainable.

    ``parent`` is the node the tokens follow, or None to start a new context root in segment 0.
    """

    kind: ClassVar[str] = "prompt"
    arrays: ClassVar[tuple[tuple[str, str], ...]] = (("token_ids", "tokens"),)

    parent: str | None = None
    token_ids: TokenArray = field(default_factory=_empty_tokens)
    source: str = "prompt"

    @property
    def node_id(self) -> str:
        return derive_node_id(self.event_id, "node")


@dataclass(eq=False, kw_only=True)
class Observation(Event):
    """Tool/environment tokens appended after ``parent``; part of later inputs, never trainable."""

    kind: ClassVar[str] = "observation"
    arrays: ClassVar[tuple[tuple[str, str], ...]] = (("token_ids", "tokens"),)

    parent: str
    token_ids: TokenArray = field(default_factory=_empty_tokens)
    source: str = "tool"

    @property
    def node_id(self) -> str:
        return derive_node_id(self.event_id, "node")

    def _validate(self) -> None:
        if not self.parent:
            raise ValidationError("observation: parent node is required", event_id=self.event_id)


@dataclass(eq=False, kw_only=True)
class ModelCall(Event):
    """One engine call, exactly as the engine saw and produced it.

    Input: ``parent`` node + ``appended`` tokens, with ``input_digest`` = hex BLAKE2b-128 of the
    full input (packed int32). With ``parent=None`` the ``appended`` tokens are the full input
    and the store shares whatever whole nodes of the execution's tree it already holds.

    Retokenization drift (chat calls through the gateway): ``drift_checked`` says the input continued
    the previous call's context; ``drift_at`` is the index in the full input of the first id that differs
    from the previous call's output ids (None: they came back verbatim, or nothing was checked).
    """

    kind: ClassVar[str] = "model_call"
    arrays: ClassVar[tuple[tuple[str, str], ...]] = (
        ("appended", "tokens"),
        ("output_ids", "tokens"),
        ("output_logprobs", "logprobs"),
    )

    call_kind: CallKind = "action"
    parent: str | None = None
    appended: TokenArray = field(default_factory=_empty_tokens)
    input_digest: str = ""
    output_ids: TokenArray = field(default_factory=_empty_tokens)
    output_logprobs: FloatArray = field(default_factory=_empty_logprobs)
    policy_version: int = 0
    finish_reason: str = "stop"
    timings: dict[str, float] = field(default_factory=dict)
    sampling_params: dict[str, Any] | None = None
    drift_checked: bool = False
    drift_at: int | None = None

    @property
    def call_id(self) -> str:
        return self.event_id

    @property
    def input_node_id(self) -> str | None:
        """Node holding the appended input tokens (None when nothing was appended)."""
        return derive_node_id(self.event_id, "input") if self.appended.size else None

    @property
    def output_node_id(self) -> str:
        return derive_node_id(self.event_id, "output")

    def _validate(self) -> None:  # the fewest output ids: events.limits
        if self.call_kind not in CALL_KINDS:
            raise ValidationError(
                f"model_call.call_kind must be one of {CALL_KINDS}, got {self.call_kind!r}",
                event_id=self.event_id,
            )
        if self.output_ids.size != self.output_logprobs.size:
            raise LengthMismatchError(
                f"model_call: {self.output_ids.size} output ids but {self.output_logprobs.size} log-probs; "
                "expected one rollout log-prob per output token",
                event_id=self.event_id,
            )
        if self.parent is None and self.appended.size == 0:
            raise ValidationError("model_call: empty input (no parent and no tokens)", event_id=self.event_id)
        if len(self.input_digest) != 32:
            raise ValidationError(
                f"model_call.input_digest must be a 32-char hex BLAKE2b-128 digest, got {self.input_digest!r}",
                event_id=self.event_id,
            )
        if not isinstance(self.policy_version, int) or self.policy_version < 0:
            raise ValidationError(f"policy_version must be an integer ≥ 0, got {self.policy_version!r}")
        self._validate_drift()

    def _validate_drift(self) -> None:
        if not isinstance(self.drift_checked, bool):
            raise ValidationError(f"model_call.drift_checked must be a boolean, got {self.drift_checked!r}",
                                  event_id=self.event_id)
        if self.drift_at is None:
            return
        if isinstance(self.drift_at, bool) or not isinstance(self.drift_at, int) or self.drift_at < 0:
            raise ValidationError(f"model_call.drift_at must be an integer ≥ 0 or null, got {self.drift_at!r}",
                                  event_id=self.event_id)
        if not self.drift_checked:
            raise ValidationError("model_call.drift_at needs drift_checked true", event_id=self.event_id)

    def check_numbers(self) -> None:
        lp = self.output_logprobs
        if lp.size and not (float(lp.max()) <= MAX_LOGPROB and float(lp.min()) > -math.inf):
            raise DTypeError(
                "model_call.output_logprobs must be finite log-probabilities ≤ 0, "
                f"got range [{float(np.nanmin(lp))}, {float(np.nanmax(lp))}]",
                event_id=self.event_id,
            )


@dataclass(eq=False, kw_only=True)
class Fork(Event):
    """The state after ``at_node`` is continued ``branches`` ways."""

    kind: ClassVar[str] = "fork"

    at_node: str
    branches: int = 2
    reason: str = "resample"

    def _validate(self) -> None:
        if not isinstance(self.branches, int) or self.branches < 2:
            raise ValidationError(f"fork.branches must be an integer ≥ 2, got {self.branches!r}")


@dataclass(eq=False, kw_only=True)
class SegmentBoundary(Event):
    """Compaction: the context ended by summary node ``from_node`` is replaced by a fresh one.

    ``token_ids`` is the new context (task prompt + the summary, typically); it becomes the
    root node of the next segment.
    """

    kind: ClassVar[str] = "segment_boundary"
    arrays: ClassVar[tuple[tuple[str, str], ...]] = (("token_ids", "tokens"),)

    from_node: str
    token_ids: TokenArray = field(default_factory=_empty_tokens)

    @property
    def root_node_id(self) -> str:
        return derive_node_id(self.event_id, "root")


@dataclass(eq=False, kw_only=True)
class ExecutionFinished(Event):
    """The execution ended with ``status``; ``reward`` is the final reward (None when unscored)."""

    kind: ClassVar[str] = "execution_finished"

    status: FinishStatus = "success"
    reward: float | None = None
    leaf_rewards: dict[str, float] = field(default_factory=dict)
    message: str = ""

    def _validate(self) -> None:
        if self.status not in FINISH_STATUSES:
            raise ValidationError(f"execution_finished.status must be one of {FINISH_STATUSES}, got {self.status!r}")
        values = [self.reward] if self.reward is not None else []
        values += list(self.leaf_rewards.values())
        if any(not isinstance(v, int | float) or not math.isfinite(v) for v in values):
            raise ValidationError("execution_finished: rewards must be finite numbers")


@dataclass(eq=False, kw_only=True)
class PartialScore(Event):
    """A scorer's grade of checkable partial progress; ``revision`` 0, 1, … revises earlier ones."""

    kind: ClassVar[str] = "partial_score"

    score: float
    components: dict[str, float] = field(default_factory=dict)
    scorer: str = "default"
    revision: int = 0
    note: str = ""

    def _validate(self) -> None:
        if not isinstance(self.score, int | float) or not math.isfinite(self.score):
            raise ValidationError(f"partial_score.score must be a finite number, got {self.score!r}")
        if not isinstance(self.revision, int) or self.revision < 0:
            raise ValidationError(f"partial_score.revision must be an integer ≥ 0, got {self.revision!r}")


@dataclass(eq=False, kw_only=True)
class PolicyPublished(UnscopedEvent):
    """A learner published weights ``version`` of ``run_id`` (not scoped to an execution)."""

    kind: ClassVar[str] = "policy_published"

    run_id: str
    version: int
    checkpoint: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)

    def _validate_fields(self) -> None:
        if not isinstance(self.version, int) or self.version < 0:
            raise ValidationError(f"policy_published.version must be an integer ≥ 0, got {self.version!r}")
