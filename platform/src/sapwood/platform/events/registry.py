"""Every event kind by name, and the constructor the codec and rebuilds use."""

from __future__ import annotations

from typing import Any

import numpy as np

from sapwood.platform.errors import ValidationError
from sapwood.platform.events import cells, execution
from sapwood.platform.events.base import Event

__all__ = ["EVENT_TYPES", "build_event"]

EVENT_TYPES: dict[str, type[Event]] = {
    cls.kind: cls
    for cls in (
        execution.ExecutionStarted,
        execution.Prompt,
        execution.ModelCall,
        execution.Observation,
        execution.Fork,
        execution.SegmentBoundary,
        execution.ExecutionFinished,
        execution.PartialScore,
        execution.PolicyPublished,
        cells.CellRegistered,
        cells.CellHeartbeat,
        cells.RoleAssigned,
        cells.SwitchPhase,
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
