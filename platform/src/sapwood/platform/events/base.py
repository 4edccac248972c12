"""The event envelope every TITO event shares, and the ids producers derive without the store.

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
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar, Literal

import numpy as np

from sapwood.platform.errors import SchemaVersionError, ValidationError
from sapwood.platform.events.limits import check_limits
from sapwood.platform.json_values import check_json_numbers, doubles_for_large_ints
from sapwood.platform.tokens import FloatArray, TokenArray, as_logprobs, as_tokens, check_token_range
from sapwood.platform.uuids import canonical_uuid

__all__ = [
    "CALL_KINDS",
    "FINISH_STATUSES",
    "SCHEMA_VERSION",
    "SUPPORTED_SCHEMA_VERSIONS",
    "CallKind",
    "Event",
    "ExecutionStatus",
    "FinishStatus",
    "UnscopedEvent",
    "derive_node_id",
    "new_event_id",
]

SCHEMA_VERSION = 1
SUPPORTED_SCHEMA_VERSIONS = frozenset({1})

CallKind = Literal["action", "summary"]
FinishStatus = Literal["success", "timeout", "error"]
"""How an execution ended (``execution_finished.status``); the one list of finish statuses."""
ExecutionStatus = Literal["running", FinishStatus]
"""An execution's status: running until its ``execution_finished``, then its finish status."""
CALL_KINDS = ("action", "summary")
FINISH_STATUSES: tuple[FinishStatus, ...] = ("success", "timeout", "error")


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
        check_limits(self)
        self._check_json_values()
        if numbers:
            self.check_numbers()

    def _validate(self) -> None:
        """Kind-specific checks."""

    def _check_json_values(self) -> None:
        """Every JSON value reads back on both stores (:mod:`sapwood.platform.json_values`): numbers that
        are not doubles exactly are refused; integers beyond ±2**53 are kept as the doubles they are."""
        try:
            for name, value in self.scalar_fields().items():
                check_json_numbers(value, f"{self.kind}.{name}")
                converted = doubles_for_large_ints(value)
                if converted is not value:
                    object.__setattr__(self, name, converted)
        except ValidationError as exc:
            raise ValidationError(str(exc), event_id=self.event_id) from None

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

    def wire_scalar_fields(self) -> dict[str, Any]:
        """The scalar fields that differ from their defaults (a field left out takes its default: wire
        format §6), so an event's header carries only what it says; required fields are always kept."""
        names, get = _scalar_getter(type(self))
        defaults = _scalar_defaults(type(self))
        return {n: v for n, v in zip(names, get(self), strict=True)
                if n not in defaults or not _is_default(v, defaults[n])}

    @classmethod
    def scalar_defaults(cls) -> dict[str, Any]:
        """The scalar fields that have a default, with it (what a left-out field reads as)."""
        return dict(_scalar_defaults(cls))

    def array_fields(self) -> dict[str, np.ndarray]:
        return {name: getattr(self, name) for name, _ in self.arrays}

    def n_tokens(self) -> int:
        """Token ids carried by this event (log-probs not counted)."""
        return sum(int(getattr(self, n).size) for n, k in self.arrays if k == "tokens")

    def check_vocab(self, vocab_size: int | None) -> None:
        for name, array_kind in self.arrays:
            if array_kind == "tokens":
                check_token_range(getattr(self, name), vocab_size, name=f"{self.kind}.{name}")


@dataclass(eq=False, kw_only=True)
class UnscopedEvent(Event):
    """An event of no execution (a run's, a cell's): ``execution_id`` and ``seq`` stay None."""

    scope: ClassVar[str] = "run"
    """What the event is keyed by instead, for error messages."""

    @property
    def execution_scoped(self) -> bool:
        return False

    def _validate(self) -> None:
        if self.execution_id is not None or self.seq is not None:
            raise ValidationError(f"{self.kind} is {self.scope}-scoped: execution_id and seq must be None")
        self._validate_fields()

    def _validate_fields(self) -> None:
        """Kind-specific checks."""


_ENVELOPE = frozenset({"event_id", "execution_id", "seq", "schema_version", "created_at"})


_SCALAR_GETTERS: dict[type, tuple[tuple[str, ...], Callable[[Event], tuple[Any, ...]]]] = {}


_SCALAR_DEFAULTS: dict[type, dict[str, Any]] = {}


def _scalar_defaults(cls: type[Event]) -> dict[str, Any]:
    """``cls``'s scalar fields that have a default, with it (a default factory called once, here)."""
    got = _SCALAR_DEFAULTS.get(cls)
    if got is None:
        names = set(_scalar_getter(cls)[0])
        got = {}
        for f in fields(cls):
            if f.name in names:
                d = f.default_factory() if f.default_factory is not MISSING else f.default
                if d is not MISSING:
                    got[f.name] = d
        _SCALAR_DEFAULTS[cls] = got
    return got


def _is_default(value: Any, default: Any) -> bool:
    """``value`` is ``default`` exactly: same type and equal (``0`` is not ``False``, ``0.0`` is not ``0``)."""
    return value is default or (type(value) is type(default) and value == default)


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
