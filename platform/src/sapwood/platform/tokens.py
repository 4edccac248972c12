"""Token arrays: canonical dtypes, packing to little-endian bytes, content digests.

Token ids travel and are stored as packed little-endian int32 (4 B/token); log-probs as
little-endian float32 (4 B/token). Digests are BLAKE2b-128 over those packed bytes.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import numpy.typing as npt

from sapwood.platform.errors import DTypeError, TokenRangeError

TOKEN_DTYPE = np.dtype("<i4")
LOGPROB_DTYPE = np.dtype("<f4")
DIGEST_SIZE = 16

TokenArray = npt.NDArray[np.int32]
FloatArray = npt.NDArray[np.float32]


def as_tokens(values: Any, *, name: str = "token ids") -> TokenArray:
    """Return ``values`` as a 1-D little-endian int32 array (copy only when needed).

    Accepts sequences of Python ints or integer numpy arrays; floats, bools and
    multi-dimensional input are rejected with :class:`DTypeError`.
    """
    arr = np.asarray(values)
    if arr.ndim != 1:
        if arr.size == 0:
            return np.zeros(0, dtype=TOKEN_DTYPE)
        raise DTypeError(f"{name}: expected a 1-D array of integer token ids, got shape {arr.shape}")
    if arr.size == 0:
        return np.zeros(0, dtype=TOKEN_DTYPE)
    if arr.dtype.kind not in "iu":
        raise DTypeError(f"{name}: expected integer token ids (int32), got dtype {arr.dtype}")
    if arr.dtype != TOKEN_DTYPE:
        if arr.size and (int(arr.min()) < np.iinfo(np.int32).min or int(arr.max()) > np.iinfo(np.int32).max):
            raise TokenRangeError(f"{name}: ids must fit in int32, got range [{arr.min()}, {arr.max()}]")
        arr = arr.astype(TOKEN_DTYPE)
    return arr


def as_logprobs(values: Any, *, name: str = "log-probs") -> FloatArray:
    """Return ``values`` as a 1-D little-endian float32 array; finite and ≤ 0 are checked by callers."""
    arr = np.asarray(values)
    if arr.size == 0:
        return np.zeros(0, dtype=LOGPROB_DTYPE)
    if arr.ndim != 1:
        raise DTypeError(f"{name}: expected a 1-D float array, got shape {arr.shape}")
    if arr.dtype.kind != "f":
        raise DTypeError(f"{name}: expected float log-probs (float32), got dtype {arr.dtype}")
    if arr.dtype != LOGPROB_DTYPE:
        arr = arr.astype(LOGPROB_DTYPE)
    return arr


#: Largest log-prob accepted (engines may report log(1) as a tiny positive number).
MAX_LOGPROB = 1e-4


def id_limit(vocab_size: int | None) -> int:
    """Bound every valid id is below, ids read as uint32 (negative ids read as ≥ 2**31)."""
    return vocab_size if vocab_size is not None else 1 << 31


def check_token_range(ids: TokenArray, vocab_size: int | None, *, name: str = "token ids") -> None:
    """Raise :class:`TokenRangeError` for negative ids or ids ≥ ``vocab_size``."""
    if ids.size == 0:
        return
    # One pass: read as uint32, a negative id is ≥ 2**31, above every vocabulary.
    top = int(ids.view(np.uint32).max()) if ids.dtype == TOKEN_DTYPE else int(ids.max())
    if top < id_limit(vocab_size):
        return
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0:
        raise TokenRangeError(f"{name}: token ids must be ≥ 0, found {lo}")
    if vocab_size is not None and hi >= vocab_size:
        raise TokenRangeError(f"{name}: token id {hi} is out of vocabulary (expected < vocab_size={vocab_size})")


def pack(arr: np.ndarray) -> bytes:
    """Packed little-endian bytes of a canonical token or log-prob array."""
    return arr.tobytes()


def unpack_tokens(data: bytes | memoryview) -> TokenArray:
    """Inverse of :func:`pack` for token ids (zero-copy view on ``data``)."""
    return np.frombuffer(data, dtype=TOKEN_DTYPE)


def unpack_logprobs(data: bytes | memoryview) -> FloatArray:
    """Inverse of :func:`pack` for log-probs (zero-copy view on ``data``)."""
    return np.frombuffer(data, dtype=LOGPROB_DTYPE)


def digest_bytes(data: bytes | memoryview) -> bytes:
    """BLAKE2b-128 digest of packed bytes: the content address of a span."""
    return hashlib.blake2b(data, digest_size=DIGEST_SIZE).digest()


def input_hasher() -> Any:
    """A fresh incremental hasher for a full model input (feed packed int32 chunks)."""
    return hashlib.blake2b(digest_size=DIGEST_SIZE)


def input_digest(ids: Any) -> str:
    """Hex digest of a full model input: what producers send with ``input_digest``."""
    return digest_bytes(pack(as_tokens(ids))).hex()
