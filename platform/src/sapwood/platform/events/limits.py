"""The wire format's length limits, in one place: the validator enforces them, ``docs/wire-format.md``
states them and ``docs/wire-header.schema.json`` encodes them (``tests/ingest/test_wire_limits.py``
checks all three, and the stored columns, against these tables).
"""

from __future__ import annotations

from typing import Any

from sapwood.platform.errors import ValidationError

#: kind → string field → (min, max) characters; the max is the width of the column the field is stored in.
STRING_LENGTHS: dict[str, dict[str, tuple[int, int]]] = {
    "execution_started": {"run_id": (1, 128), "task_id": (1, 256), "task_family": (0, 64), "engine": (0, 128)},
    "model_call": {"finish_reason": (0, 32)},
    "partial_score": {"scorer": (0, 128)},
    "policy_published": {"run_id": (1, 128)},
}

#: kind → array → the fewest elements it may hold (arrays not named may be empty).
ARRAY_MIN_COUNTS: dict[str, dict[str, int]] = {
    "prompt": {"token_ids": 1},
    "observation": {"token_ids": 1},
    "model_call": {"output_ids": 1, "output_logprobs": 1},
    "segment_boundary": {"token_ids": 1},
}


def check_limits(event: Any) -> None:
    """Raise :class:`ValidationError` naming the field when one of ``event``'s strings or arrays is outside
    the limits above."""
    for name, (low, high) in STRING_LENGTHS.get(event.kind, {}).items():
        value = getattr(event, name)
        if not isinstance(value, str) or not low <= len(value) <= high:
            got = f"{len(value)} characters" if isinstance(value, str) else repr(value)[:40]
            raise ValidationError(f"{event.kind}.{name} must be a string of {low}-{high} characters, got {got}",
                                  event_id=event.event_id)
    for name, fewest in ARRAY_MIN_COUNTS.get(event.kind, {}).items():
        size = int(getattr(event, name).size)
        if size < fewest:
            raise ValidationError(f"{event.kind}.{name} must hold at least {fewest} element(s), got {size}",
                                  event_id=event.event_id)


__all__ = ["ARRAY_MIN_COUNTS", "STRING_LENGTHS", "check_limits"]
