"""Compact binary wire codec for TITO events.

Layout (all integers little-endian)::

    b"SPWD"  magic
    u8       wire version (1)
    u8       flags: bit 0 = payload zstd-compressed
    payload: u32 header length · header (UTF-8 JSON, scalars only) · raw array bytes

With the zstd flag the payload is one or more zstd frames, with or without a declared content
size (streaming encoders leave it out). Decoding never inflates more than ``max_bytes``: a
declared size above it is refused before anything is allocated, and frames without one are
inflated in bounded steps that stop one byte past the limit (:class:`PayloadTooLargeError`).
The full specification, for producers in other languages, is ``docs/wire-format.md``.

The header names each array with its dtype and element count (``[name, "<i4", n]``);
token ids are packed int32 and log-probs float32 — numbers never travel as JSON lists.
"""

from __future__ import annotations

import functools
import json
import struct
from typing import Any

import numpy as np
import orjson
import zstandard

from sapwood.platform.errors import DecodeError, DTypeError, PayloadTooLargeError, SchemaVersionError
from sapwood.platform.events import EVENT_TYPES, SUPPORTED_SCHEMA_VERSIONS, Event, build_event
from sapwood.platform.tokens import LOGPROB_DTYPE, TOKEN_DTYPE

MAGIC = b"SPWD"
WIRE_VERSION = 1
FLAG_ZSTD = 0x01
_PREFIX = struct.Struct("<4sBB")
_U32 = struct.Struct("<I")
_DTYPES = {"tokens": TOKEN_DTYPE, "logprobs": LOGPROB_DTYPE}
#: Payloads smaller than this are not worth compressing.
ZSTD_MIN_BYTES = 512
#: Default bound of a decoded payload (bytes after decompression): the default event limit.
DEFAULT_MAX_BYTES = 1_000_000
#: Output bytes asked of the zstd stream reader per step when a frame declares no content size.
_INFLATE_STEP = 1 << 20

_compressor = zstandard.ZstdCompressor(level=1)
_decompressor = zstandard.ZstdDecompressor()


def encode(event: Event, *, compress: bool = False) -> bytes:
    """Serialize ``event``; with ``compress`` the payload is zstd-compressed when that pays off."""
    # empty arrays and scalar fields at their defaults are left out: a reader takes the defaults (§6)
    arrays = {n: a for n, a in event.array_fields().items() if a.size}
    header = {
        "schema_version": event.schema_version,
        "kind": event.kind,
        "event_id": event.event_id,
        "execution_id": event.execution_id,
        "seq": event.seq,
        "created_at": event.created_at,
        "fields": event.wire_scalar_fields(),
        "arrays": [[name, arr.dtype.str, int(arr.size)] for name, arr in arrays.items()],
    }
    head = json.dumps(header, separators=(",", ":")).encode()
    payload = b"".join([_U32.pack(len(head)), head, *(arr.tobytes() for arr in arrays.values())])
    flags = 0
    if compress and len(payload) >= ZSTD_MIN_BYTES:
        payload = _compressor.compress(payload)
        flags |= FLAG_ZSTD
    return _PREFIX.pack(MAGIC, WIRE_VERSION, flags) + payload


def decode(data: bytes | memoryview, *, validate: bool = True, max_bytes: int | None = DEFAULT_MAX_BYTES) -> Event:
    """Parse bytes from :func:`encode`; raise :class:`DecodeError` (or a subclass of
    :class:`ValidationError`) saying what was wrong and what was expected.

    ``max_bytes`` bounds the payload after decompression (None: unbounded, for trusted bytes);
    a larger one raises :class:`PayloadTooLargeError` without being inflated past the bound.
    """
    buf = data if isinstance(data, bytes) else bytes(data)
    if len(buf) < _PREFIX.size:
        raise DecodeError(f"event too short: {len(buf)} bytes, expected at least {_PREFIX.size}")
    magic, version, flags = _PREFIX.unpack_from(buf)
    if magic != MAGIC:
        raise DecodeError(f"not a Sapwood event: magic {magic!r}, expected {MAGIC!r}")
    if version != WIRE_VERSION:
        raise SchemaVersionError(f"unknown wire version {version}, expected {WIRE_VERSION}")
    if flags & ~FLAG_ZSTD:
        raise DecodeError(f"unknown flags 0x{flags:02x}")
    payload: bytes | memoryview = memoryview(buf)[_PREFIX.size :]  # arrays are views on the record, not copies
    if flags & FLAG_ZSTD:
        payload = inflate(payload, max_bytes)
    elif max_bytes is not None and len(payload) > max_bytes:
        raise PayloadTooLargeError(f"payload of {len(payload):,} bytes exceeds max_bytes={max_bytes:,}")
    header, offset = _read_header(payload)
    version_seen = header.get("schema_version")
    if not isinstance(version_seen, int | float) or isinstance(version_seen, bool) or (
            version_seen not in SUPPORTED_SCHEMA_VERSIONS):
        raise SchemaVersionError(
            f"unknown schema version {version_seen!r}; expected one of {sorted(SUPPORTED_SCHEMA_VERSIONS)}",
            event_id=header.get("event_id"),
        )
    kind = header.get("kind")
    cls = EVENT_TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise DecodeError(f"unknown event kind {kind!r}; expected one of {sorted(EVENT_TYPES)}")
    declared = dict(cls.arrays)
    arrays: dict[str, np.ndarray] = {}
    listed = header.get("arrays", [])
    if not isinstance(listed, list):
        raise DecodeError(f"header.arrays must be a list of [name, dtype, count], got {type(listed).__name__}")
    for entry in listed:
        try:
            name, dtype_str, count = entry
            count = int(count)
        except (TypeError, ValueError):
            raise DecodeError(f"bad array descriptor {entry!r}, expected [name, dtype, count]") from None
        if not isinstance(name, str) or name not in declared:
            raise DecodeError(f"{kind}: unexpected array {name!r}; expected {sorted(declared)}")
        expected = _DTYPES[declared[name]]
        if _dtype_of(dtype_str) != expected:
            raise DTypeError(
                f"{kind}.{name}: wrong dtype {dtype_str!r}, expected {expected.str!r}",
                event_id=header.get("event_id"),
            )
        nbytes = count * expected.itemsize
        if count < 0 or offset + nbytes > len(payload):
            raise DecodeError(f"{kind}.{name}: truncated ({count} elements declared)")
        arrays[name] = np.frombuffer(payload, dtype=expected, count=count, offset=offset)
        offset += nbytes
    if offset != len(payload):
        raise DecodeError(f"{len(payload) - offset} trailing bytes after the declared arrays")
    envelope = {k: header.get(k) for k in ("event_id", "execution_id", "seq", "schema_version", "created_at")}
    fields_ = header.get("fields")
    if not isinstance(fields_, dict):
        raise DecodeError("header.fields must be an object")
    event = build_event(kind, envelope, fields_, arrays)  # type: ignore[arg-type]
    if validate:
        event.validate()
    return event


def inflate(frames: bytes | memoryview, max_bytes: int | None) -> bytes:
    """Decompress the zstd ``frames`` (one or more, content size declared or not) into at most
    ``max_bytes`` bytes; raise :class:`PayloadTooLargeError` above it, :class:`DecodeError` when corrupt.

    Memory stays O(``max_bytes``) and time O(output) whatever the frames declare: a first frame declaring
    more than ``max_bytes`` is refused before any output is allocated, and the output is read in a fixed
    step (``_INFLATE_STEP``; only the first read may be the first frame's declared size, so a tiny first
    frame cannot make every step tiny) that stops past the bound. A frame whose content disagrees with
    its declared size is corrupt (zstd checks it).
    """
    limit = max_bytes if max_bytes is not None else 1 << 62
    try:
        declared = zstandard.frame_content_size(frames)
    except zstandard.ZstdError as exc:
        raise DecodeError(f"corrupt zstd payload: {exc}; expected zstd frames") from None
    if declared > limit:
        raise PayloadTooLargeError(f"zstd frame declares {declared:,} bytes, above max_bytes={limit:,}")
    step = declared + 1 if 0 <= declared < _INFLATE_STEP else _INFLATE_STEP  # first read only
    parts: list[bytes] = []
    total = 0
    try:
        reader = _decompressor.stream_reader(frames, read_across_frames=True)
        while total <= limit:
            chunk = reader.read(min(step, limit + 1 - total))
            if not chunk:
                break
            parts.append(chunk)
            total += len(chunk)
            step = _INFLATE_STEP
    except zstandard.ZstdError as exc:
        raise DecodeError(f"corrupt zstd payload: {exc}") from None
    if total > limit:
        raise PayloadTooLargeError(f"zstd payload inflates past max_bytes={limit:,} "
                                 f"({len(frames):,} compressed bytes; stopped at {total:,})")
    return parts[0] if len(parts) == 1 else b"".join(parts)


def payload_size(data: bytes | memoryview) -> int | None:
    """Bytes of an encoded event's payload after decompression, from its header alone (None when a
    compressed payload declares no content size)."""
    if len(data) < _PREFIX.size:
        return None
    _magic, _version, flags = _PREFIX.unpack_from(data)
    if not flags & FLAG_ZSTD:
        return len(data) - _PREFIX.size
    try:
        size = zstandard.frame_content_size(memoryview(data)[_PREFIX.size :])
    except zstandard.ZstdError:
        return None
    return size if size >= 0 else None


def _dtype_of(text: Any) -> np.dtype[Any] | None:
    """The numpy dtype a header names (None when it names none)."""
    return _parse_dtype(text) if isinstance(text, str) else None


@functools.lru_cache(maxsize=64)
def _parse_dtype(text: str) -> np.dtype[Any] | None:
    """``np.dtype(text)``, parsed once per distinct text (None when it is not a dtype)."""
    try:
        return np.dtype(text)
    except (TypeError, ValueError):
        return None


def _read_header(payload: bytes | memoryview) -> tuple[dict[str, Any], int]:
    if len(payload) < _U32.size:
        raise DecodeError("payload too short for its header length")
    (length,) = _U32.unpack_from(payload)
    end = _U32.size + length
    if end > len(payload):
        raise DecodeError(f"header length {length} exceeds payload ({len(payload)} bytes)")
    text = payload[_U32.size : end]
    try:
        header = orjson.loads(text)
    except orjson.JSONDecodeError:
        try:  # what orjson refuses but the encoder may write: NaN, ints beyond 64 bits
            header = json.loads(bytes(text))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise DecodeError(f"header is not valid JSON: {exc}") from None
    if not isinstance(header, dict):
        raise DecodeError("header must be a JSON object")
    return header, end


def peek_key(event: Event) -> bytes:
    """Partition key: the execution id (run id for run-scoped events, cell id for cell events)."""
    key = event.execution_id or getattr(event, "run_id", "") or getattr(event, "cell_id", "") or event.event_id
    return key.encode()
