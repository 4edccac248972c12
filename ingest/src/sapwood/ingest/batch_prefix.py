"""The records that start inside a bounded prefix of an inflated Kafka record batch (format v2).

A batch that inflates past ``max_batch_bytes`` is never inflated whole; its dead letters still keep what
can be read within the bound: :func:`records_in_prefix` walks the records of the first bytes of the
inflated batch and returns, per offset, the record key and a bounded prefix of its value.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PrefixRecord:
    """One record read from a batch prefix: its key (None when null) and its value's first bytes."""

    key: bytes | None
    value: bytes
    truncated: bool
    """True when only a prefix of the value was kept (the value goes on past the prefix or the bound)."""


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    """The zigzag varint at ``pos`` and the position after it; IndexError/ValueError when cut or too long."""
    shift = result = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")


def records_in_prefix(prefix: bytes, base_offset: int, value_bytes: int) -> dict[int, PrefixRecord]:
    """Offset → :class:`PrefixRecord` for each record of ``prefix`` (the first inflated bytes of a v2
    batch's records section) whose key lies fully inside it; values are cut to ``value_bytes`` bytes.
    Stops silently at the first record that is cut before its value starts or is malformed."""
    out: dict[int, PrefixRecord] = {}
    pos = 0
    try:
        while pos < len(prefix):
            length, body = _varint(prefix, pos)
            end = body + length
            p = body + 1  # attributes
            _ts, p = _varint(prefix, p)
            delta, p = _varint(prefix, p)
            key_len, p = _varint(prefix, p)
            key = None
            if key_len >= 0:
                if p + key_len > len(prefix):
                    break
                key, p = bytes(prefix[p : p + key_len]), p + key_len
            value_len, p = _varint(prefix, p)
            if length < 0 or delta < 0:
                break
            available = max(0, min(value_len, len(prefix) - p))
            kept = min(available, value_bytes)
            out[base_offset + delta] = PrefixRecord(key, bytes(prefix[p : p + kept]), kept < max(value_len, 0))
            pos = end
    except (IndexError, ValueError):
        pass
    return out


__all__ = ["PrefixRecord", "records_in_prefix"]
