"""How token spans are stored: narrowed to the bits their largest id needs, read back as int32.

Digests always cover the canonical bytes (little-endian int32 ids, float32 log-probs); the
stored form is chosen per span by :func:`encode_span` and undone by :func:`decode_span`.

=========  ========================================  =====================================
encoding   stored as                                 for ids below (bytes per token)
=========  ========================================  =====================================
0 raw      canonical bytes                           log-probs, negative or ≥ 2**24 ids (4)
1 u16      little-endian uint16                      65,536 (2)
3 u16+h    uint16 low halves, then the high          2**(16+h), h = 1..7 (2 + h/8; 2.25
           h bits of every id packed LSB-first       for 151,936-token vocabularies)
2 u24      3-byte little-endian integers             2**24 (3)
=========  ========================================  =====================================

The ``u16+h`` form starts with a header: uint32 token count, uint8 h.
"""

from __future__ import annotations

import struct

import numpy as np

from sapwood.platform.errors import StoreError
from sapwood.platform.tokens import TOKEN_DTYPE

ENC_RAW = 0
ENC_U16 = 1
ENC_U24 = 2
ENC_U16_HIGH_BITS = 3

_HIGH_HEADER = struct.Struct("<IB")
_U16 = np.dtype("<u2")


def encode_span(arr: np.ndarray, *, bits: int | None = None) -> tuple[int, bytes]:
    """(encoding, stored bytes) of a canonical span array: int32 ids [n] or float32 log-probs [n].

    ``bits``: the bitwise OR of the ids, when the caller has it already.
    """
    if arr.dtype != TOKEN_DTYPE or arr.size == 0:
        return ENC_RAW, arr.tobytes()
    if bits is None:
        bits = int(np.bitwise_or.reduce(arr))  # its bit length is the largest id's; negative if any id is
    if bits < 0:
        return ENC_RAW, arr.tobytes()
    if bits < 1 << 16:
        return ENC_U16, arr.astype(_U16).tobytes()
    high = bits.bit_length() - 16
    if high < 8:
        hi = (arr >> 16).astype(np.uint8)
        planes = np.empty((arr.size, high), dtype=np.uint8)  # [n, high]: bit j of each id's high part
        for j in range(high):
            np.bitwise_and(hi >> j, 1, out=planes[:, j])
        packed = np.packbits(planes, bitorder="little")
        return ENC_U16_HIGH_BITS, b"".join(
            (_HIGH_HEADER.pack(arr.size, high), arr.astype(_U16).tobytes(), packed.tobytes()))
    if bits < 1 << 24:
        return ENC_U24, np.ascontiguousarray(arr).view(np.uint8).reshape(-1, 4)[:, :3].tobytes()
    return ENC_RAW, arr.tobytes()


def decode_span(encoding: int, data: bytes | memoryview) -> bytes:
    """Canonical bytes of a stored span (inverse of :func:`encode_span`)."""
    if encoding == ENC_RAW:
        return bytes(data)
    if encoding == ENC_U16:
        return np.frombuffer(data, dtype="<u2").astype(TOKEN_DTYPE).tobytes()
    if encoding == ENC_U16_HIGH_BITS:
        return _decode_high_bits(data)
    if encoding == ENC_U24:
        raw = np.frombuffer(data, dtype=np.uint8)
        if raw.size % 3:
            raise StoreError(f"corrupt span: {raw.size} bytes is not a multiple of 3 (3-byte token ids)")
        out = np.zeros((raw.size // 3, 4), dtype=np.uint8)
        out[:, :3] = raw.reshape(-1, 3)
        return out.tobytes()
    raise StoreError(f"unknown span encoding {encoding}; expected one of {ENC_RAW}, {ENC_U16}, {ENC_U24}, "
                     f"{ENC_U16_HIGH_BITS}")


def _decode_high_bits(data: bytes | memoryview) -> bytes:
    if len(data) < _HIGH_HEADER.size:
        raise StoreError(f"corrupt span: {len(data)} bytes, shorter than its {_HIGH_HEADER.size}-byte header")
    n, high = _HIGH_HEADER.unpack_from(data)
    packed_len = (n * high + 7) // 8
    if not 1 <= high <= 7 or len(data) != _HIGH_HEADER.size + 2 * n + packed_len:
        raise StoreError(f"corrupt span: header says {n} ids with {high} high bits, but it holds {len(data)} bytes")
    lo = np.frombuffer(data, dtype="<u2", count=n, offset=_HIGH_HEADER.size)
    packed = np.frombuffer(data, dtype=np.uint8, offset=_HIGH_HEADER.size + 2 * n)
    planes = np.unpackbits(packed, count=n * high, bitorder="little").reshape(n, high)
    hi = planes[:, 0].copy()  # [n] uint8
    for j in range(1, high):
        hi |= planes[:, j] << j
    out = lo.astype(TOKEN_DTYPE)
    out |= hi.astype(TOKEN_DTYPE) << 16
    return out.tobytes()
