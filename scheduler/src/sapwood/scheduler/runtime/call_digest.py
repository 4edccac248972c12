"""The digest a cell echoes for the input ids it served (no torch import: the router checks it too)."""

from __future__ import annotations

import hashlib

import numpy as np

__all__ = ["input_digest"]


def input_digest(input_ids: list[int]) -> str:
    """BLAKE2b-128 of the int32 little-endian input ids: what a cell echoes so the caller can check that
    the attempt that completed saw exactly its input."""
    return hashlib.blake2b(np.asarray(input_ids, dtype="<i4").tobytes(), digest_size=16).hexdigest()
