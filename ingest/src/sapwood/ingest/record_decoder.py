"""Kafka records → events, and the records that become dead letters instead (undecodable, oversized,
rejected by apply, or poisoned as a whole: a record batch never inflated, a record failing alone)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sapwood.ingest.deadletters import DeadLetter
from sapwood.platform.apply import ApplyResult
from sapwood.platform.codec import decode
from sapwood.platform.errors import ValidationError
from sapwood.platform.events import Event


@dataclass
class SkippedRecord:
    """Stands for one record of a batch that was never inflated (dead-lettered without its bytes)."""

    offset: int
    value: bytes = b""
    key: bytes | None = None


@dataclass
class Decoded:
    """The events of a batch in record order, the dead letters so far, and where each event came from."""

    events: list[Event] = field(default_factory=list)
    letters: list[DeadLetter] = field(default_factory=list)
    origin: dict[int, tuple[str, Any]] = field(default_factory=dict)
    """``id(event)`` → (source ``kafka:topic/partition@offset``, the record)."""

    def reject(self, result: ApplyResult) -> None:
        """Add a dead letter for every event ``apply_events(..., strict=False)`` rejected."""
        for rej in result.rejected:
            source, r = self.origin[id(rej.event)]
            self.letters.append(DeadLetter(getattr(rej.error, "reason", "invalid"), str(rej.error), bytes(r.value),
                                           source, r.key, rej.event.event_id, rej.event.execution_id))


def decode_records(batch: Mapping[Any, Sequence[Any]], *, max_event_bytes: int,
                   poison: tuple[str, str] | None = None) -> Decoded:
    """Decode ``batch`` (TopicPartition → records with ``offset``, ``value``, ``key``).

    A record over ``max_event_bytes`` is a ``too_large`` dead letter without being decoded; one the codec
    refuses gets the codec's reason (``decode``, ``too_large``, ``schema_version``, ...); ``poison``
    (reason, message) dead-letters every record as given.
    """
    out = Decoded()
    for tp, records in batch.items():
        for r in records:
            source = f"kafka:{tp.topic}/{tp.partition}@{r.offset}"
            value = bytes(r.value or b"")
            if poison is not None:
                out.letters.append(DeadLetter(poison[0], poison[1], value, source, r.key))
                continue
            if len(value) > max_event_bytes:
                out.letters.append(DeadLetter("too_large", f"record of {len(value):,} bytes exceeds "
                                              f"max_event_bytes={max_event_bytes:,}", value, source, r.key))
                continue
            try:
                event = decode(value, validate=False, max_bytes=max_event_bytes)
            except ValidationError as exc:
                out.letters.append(DeadLetter(exc.reason, str(exc), value, source, r.key, exc.event_id))
                continue
            except Exception as exc:  # malformed beyond what the codec anticipates
                out.letters.append(DeadLetter("decode", f"{type(exc).__name__}: {exc}", value, source, r.key))
                continue
            out.events.append(event)
            out.origin[id(event)] = (source, r)
    return out


__all__ = ["Decoded", "SkippedRecord", "decode_records"]
