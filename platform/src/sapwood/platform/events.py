"""TITO event model: every fact Sapwood records is one of these immutable events.

Each event carries a producer-generated ``event_id`` (UUID string), a ``schema_version``
and, when it belongs to an execution, the ``execution_id`` and a per-execution sequence
number ``seq`` (0 for ``execution_started``, then +1 per event). Token ids are 1-D
little-endian int32 numpy arrays and log-probs float32 arrays (see :mod:`tokens`).

Nodes of the trajectory tree are named by ids derived from the event that creates them
(:func:`derive_node_id`), so a producer knows a node's id without asking the store.
"""

from __future__ import annotations

import functools
import hashlib
import math
import operator
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Literal

import numpy as np

from sapwood.platform.errors import (
    DTypeError,
    LengthMismatchError,
    SchemaVersionError,
    ValidationError,
)
from sapwood.platform.tokens import (
    MAX_LOGPROB,
    FloatArray,
    TokenArray,
    as_logprobs,
    as_tokens,
    check_token_range,
)
from sapwood.platform.uuids import canonical_uuid

SCHEMA_VERSION = 1
SUPPORTED_SCHEMA_VERSIONS = frozenset({1})

CallKind = Literal["action", "summary"]
FinishStatus = Literal["success", "timeout", "error"]
CALL_KINDS = ("action", "summary")
FINISH_STATUSES = ("success", "timeout", "error")


def new_event_id() -> str:
    """A fresh random event id (UUID4 string)."""
    return str(uuid.uuid4())


@functools.lru_cache(maxsize=65_536)
def derive_node_id(event_id: str, part: str) -> str:
    """Deterministic id of the tree node that event ``event_id`` creates as ``part``.

    A UUIDv8 (RFC 9562, custom) whose 122 free bits are BLAKE2b-128 of ``"<event_id>/<part>"``;
    producers compute the same ids without asking the store. Memoized: apply asks for each id
    several times per event.
    """
    h = bytearray(hashlib.blake2b(f"{event_id}/{part}".encode(), digest_size=16).digest())
    h[6] = (h[6] & 0x0F) | 0x80  # version 8
    h[8] = (h[8] & 0x3F) | 0x80  # RFC variant
    x = h.hex()
    return f"{x[:8]}-{x[8:12]}-{x[12:16]}-{x[16:20]}-{x[20:]}"


def _empty_tokens() -> TokenArray:
    return np.zeros(0, dtype=np.int32)


def _empty_logprobs() -> FloatArray:
    return np.zeros(0, dtype=np.float32)


@dataclass(eq=False, kw_only=True)
class Event:
    """Envelope shared by all events."""

    kind: ClassVar[str] = "event"
    #: Names of the array fields and their kind ("tokens" or "logprobs").
    arrays: ClassVar[tuple[tuple[str, str], ...]] = ()

    event_id: str = field(default_factory=new_event_id)
    execution_id: str | None = None
    seq: int | None = None
    schema_version: int = SCHEMA_VERSION
    created_at: float = field(default_factory=time.time)

    def __post_init__(self) -> None:
        for name, array_kind in self.arrays:
            raw = getattr(self, name)
            label = f"{self.kind}.{name}"
            value = as_tokens(raw, name=label) if array_kind == "tokens" else as_logprobs(raw, name=label)
            object.__setattr__(self, name, value)

    # -- static validation (no store needed) ---------------------------------------------------------
    def validate(self, *, numbers: bool = True) -> None:
        """Check everything that can be checked without the store; raise :class:`ValidationError`.

        ``numbers=False`` leaves out :meth:`check_numbers` (for callers that check a whole batch's
        arrays at once).
        """
        if self.schema_version not in SUPPORTED_SCHEMA_VERSIONS:
            raise SchemaVersionError(
                f"unknown schema version {self.schema_version}; this Sapwood reads versions "
                f"{sorted(SUPPORTED_SCHEMA_VERSIONS)}",
                event_id=self.event_id,
            )
        try:
            canonical_uuid(self.event_id)
        except (ValueError, AttributeError, TypeError):
            raise ValidationError(f"event_id must be a UUID string, got {self.event_id!r}") from None
        if isinstance(self.created_at, bool) or not isinstance(self.created_at, int | float) or not math.isfinite(
                self.created_at):
            raise ValidationError(f"{self.kind}: created_at must be a finite number (unix seconds), got "
                                  f"{self.created_at!r}", event_id=self.event_id)
        if self.execution_scoped:
            if not self.execution_id:
                raise ValidationError(f"{self.kind}: execution_id is required", event_id=self.event_id)
            if not isinstance(self.seq, int) or self.seq < 0:
                raise ValidationError(
                    f"{self.kind}: seq must be an integer ≥ 0 (per-execution sequence number), got {self.seq!r}",
                    event_id=self.event_id,
                )
        self._validate()
        if numbers:
            self.check_numbers()

    def _validate(self) -> None:
        """Kind-specific checks."""

    def check_numbers(self) -> None:
        """Checks that read every value of an array (model calls: log-probs finite and ≤ 0)."""

    @property
    def execution_scoped(self) -> bool:
        return True

    # -- plain-data views -----------------------------------------------------------------------------
    def scalar_fields(self) -> dict[str, Any]:
        """Every non-envelope, non-array field as JSON-able data."""
        names, get = _scalar_getter(type(self))
        return dict(zip(names, get(self), strict=True))

    def array_fields(self) -> dict[str, np.ndarray]:
        return {name: getattr(self, name) for name, _ in self.arrays}

    def n_tokens(self) -> int:
        """Token ids carried by this event (log-probs not counted)."""
        return sum(int(getattr(self, n).size) for n, k in self.arrays if k == "tokens")

    def check_vocab(self, vocab_size: int | None) -> None:
        for name, array_kind in self.arrays:
            if array_kind == "tokens":
                check_token_range(getattr(self, name), vocab_size, name=f"{self.kind}.{name}")


_ENVELOPE = frozenset({"event_id", "execution_id", "seq", "schema_version", "created_at"})


_SCALAR_GETTERS: dict[type, tuple[tuple[str, ...], Callable[[Event], tuple[Any, ...]]]] = {}


def _scalar_getter(cls: type[Event]) -> tuple[tuple[str, ...], Callable[[Event], tuple[Any, ...]]]:
    """Names of ``cls``'s non-envelope, non-array fields in declaration order, and one getter returning
    their values as a tuple (built once per class)."""
    getter = _SCALAR_GETTERS.get(cls)
    if getter is None:
        skip = _ENVELOPE | {n for n, _ in cls.arrays}
        names = tuple(f.name for f in fields(cls) if f.name not in skip)
        values = operator.attrgetter(*names) if names else None

        def get(event: Event) -> tuple[Any, ...]:
            if values is None:
                return ()
            got = values(event)
            return got if len(names) > 1 else (got,)  # attrgetter of one name returns the bare value

        getter = _SCALAR_GETTERS[cls] = (names, get)
    return getter


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

    def _validate(self) -> None:
        if self.token_ids.size == 0:
            raise ValidationError("prompt: token_ids must not be empty", event_id=self.event_id)


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
        if self.token_ids.size == 0:
            raise ValidationError("observation: token_ids must not be empty", event_id=self.event_id)
        if not self.parent:
            raise ValidationError("observation: parent node is required", event_id=self.event_id)


@dataclass(eq=False, kw_only=True)
class ModelCall(Event):
    """One engine call, exactly as the engine saw and produced it.

    Input: ``parent`` node + ``appended`` tokens, with ``input_digest`` = hex BLAKE2b-128 of the
    full input (packed int32). With ``parent=None`` the ``appended`` tokens are the full input
    and the store shares whatever whole nodes of the execution's tree it already holds.
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

    def _validate(self) -> None:
        if self.call_kind not in CALL_KINDS:
            raise ValidationError(
                f"model_call.call_kind must be one of {CALL_KINDS}, got {self.call_kind!r}",
                event_id=self.event_id,
            )
        if self.output_ids.size == 0:
            raise ValidationError("model_call.output_ids must not be empty", event_id=self.event_id)
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

    def _validate(self) -> None:
        if self.token_ids.size == 0:
            raise ValidationError("segment_boundary: the new context must not be empty", event_id=self.event_id)


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
class PolicyPublished(Event):
    """A learner published weights ``version`` of ``run_id`` (not scoped to an execution)."""

    kind: ClassVar[str] = "policy_published"

    run_id: str
    version: int
    checkpoint: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def execution_scoped(self) -> bool:
        return False

    def _validate(self) -> None:
        if self.execution_id is not None or self.seq is not None:
            raise ValidationError("policy_published is run-scoped: execution_id and seq must be None")
        if not isinstance(self.version, int) or self.version < 0:
            raise ValidationError(f"policy_published.version must be an integer ≥ 0, got {self.version!r}")


CELL_TIERS = ("core", "satellite")
CELL_ROLES = ("rollout", "train", "idle")


@dataclass(eq=False, kw_only=True)
class _CellEvent(Event):
    """Base of the scheduler's cell events: keyed by ``cell_id``, not scoped to an execution (like
    ``policy_published``: execution_id and seq stay None; Kafka partitions them by cell id)."""

    cell_id: str

    @property
    def execution_scoped(self) -> bool:
        return False

    def _validate(self) -> None:
        if self.execution_id is not None or self.seq is not None:
            raise ValidationError(f"{self.kind} is cell-scoped: execution_id and seq must be None")
        if not isinstance(self.cell_id, str) or not 0 < len(self.cell_id) <= 128:
            raise ValidationError(f"{self.kind}.cell_id must be a non-empty string (≤ 128 chars), got {self.cell_id!r}")
        self._validate_cell()

    def _validate_cell(self) -> None:
        """Kind-specific checks."""


@dataclass(eq=False, kw_only=True)
class CellRegistered(_CellEvent):
    """A cell joined the cluster: its tier and its rollout capacity (concurrent rollouts it serves)."""

    kind: ClassVar[str] = "cell_registered"

    tier: str = "core"
    capacity: int = 1
    metadata: dict[str, Any] = field(default_factory=dict)

    def _validate_cell(self) -> None:
        if self.tier not in CELL_TIERS:
            raise ValidationError(f"cell_registered.tier must be one of {CELL_TIERS}, got {self.tier!r}")
        if not isinstance(self.capacity, int) or isinstance(self.capacity, bool) or self.capacity < 1:
            raise ValidationError(f"cell_registered.capacity must be an integer ≥ 1, got {self.capacity!r}")


@dataclass(eq=False, kw_only=True)
class CellHeartbeat(_CellEvent):
    """A cell is alive (its time is ``created_at``); ``status`` carries optional figures (e.g. busy slots)."""

    kind: ClassVar[str] = "cell_heartbeat"

    status: dict[str, Any] = field(default_factory=dict)


@dataclass(eq=False, kw_only=True)
class RoleAssigned(_CellEvent):
    """The scheduler gave ``cell_id`` a role, with the signal snapshot it decided on and why."""

    kind: ClassVar[str] = "role_assigned"

    role: str
    previous_role: str = "idle"
    reason: str = ""
    policy: str = ""
    signals: dict[str, Any] = field(default_factory=dict)

    def _validate_cell(self) -> None:
        for name in ("role", "previous_role"):
            if getattr(self, name) not in CELL_ROLES:
                raise ValidationError(f"role_assigned.{name} must be one of {CELL_ROLES}, got {getattr(self, name)!r}")


@dataclass(eq=False, kw_only=True)
class SwitchPhase(_CellEvent):
    """One phase of a role switch (e.g. drain, migrate, load) and how long it took."""

    kind: ClassVar[str] = "switch_phase"

    phase: str
    duration_s: float
    role: str = "idle"

    def _validate_cell(self) -> None:
        if not isinstance(self.phase, str) or not 0 < len(self.phase) <= 64:
            raise ValidationError(f"switch_phase.phase must be a non-empty string of ≤ 64 chars, got {self.phase!r}")
        d = self.duration_s
        if isinstance(d, bool) or not isinstance(d, int | float) or not math.isfinite(d) or d < 0:
            raise ValidationError(f"switch_phase.duration_s must be a finite number ≥ 0, got {d!r}")
        if self.role not in CELL_ROLES:
            raise ValidationError(f"switch_phase.role must be one of {CELL_ROLES}, got {self.role!r}")


EVENT_TYPES: dict[str, type[Event]] = {
    cls.kind: cls
    for cls in (
        ExecutionStarted,
        Prompt,
        ModelCall,
        Observation,
        Fork,
        SegmentBoundary,
        ExecutionFinished,
        PartialScore,
        PolicyPublished,
        CellRegistered,
        CellHeartbeat,
        RoleAssigned,
        SwitchPhase,
    )
}


def build_event(
    kind: str,
    envelope: dict[str, Any],
    scalars: dict[str, Any],
    arrays: dict[str, np.ndarray],
) -> Event:
    """Construct an event of ``kind`` from its parts (used by the codec and by rebuilds)."""
    cls = EVENT_TYPES.get(kind)
    if cls is None:
        raise ValidationError(f"unknown event kind {kind!r}; expected one of {sorted(EVENT_TYPES)}")
    declared = {n for n, _ in cls.arrays}
    if set(arrays) - declared:
        raise ValidationError(f"{kind}: unexpected arrays {sorted(set(arrays) - declared)}")
    try:
        return cls(**envelope, **scalars, **arrays)  # type: ignore[arg-type]
    except TypeError as exc:
        raise ValidationError(f"{kind}: bad fields: {exc}") from None


__all__ = [
    "CALL_KINDS",
    "CELL_ROLES",
    "CELL_TIERS",
    "EVENT_TYPES",
    "FINISH_STATUSES",
    "SCHEMA_VERSION",
    "CellHeartbeat",
    "CellRegistered",
    "Event",
    "ExecutionFinished",
    "ExecutionStarted",
    "Fork",
    "ModelCall",
    "Observation",
    "PartialScore",
    "PolicyPublished",
    "Prompt",
    "RoleAssigned",
    "SegmentBoundary",
    "SwitchPhase",
    "build_event",
    "derive_node_id",
    "new_event_id",
]
