"""Records a producer we did not write might send: the inputs of the fault campaign and its tests.

Every builder returns raw Kafka record values (bytes) and the dead-letter reason ingest must
give them (``None``: the record is valid and must be applied). Bombs are built by streaming
zeros through a zstd compressor, so a 30,000:1 record costs ~1 MB of memory to make.
"""

from __future__ import annotations

import itertools
import json
import struct
import uuid
from collections.abc import Iterable, Iterator

import numpy as np
import zstandard

from sapwood.platform.codec import FLAG_ZSTD, MAGIC, WIRE_VERSION, encode
from sapwood.platform.events import Event

_PREFIX = struct.Struct("<4sBB")
_STEP = 1 << 20


def zstd_record(payload: bytes, *, declare_size: bool = True, frames: int = 1) -> bytes:
    """A wire record whose ``payload`` (u32 header length · header · arrays) is zstd-compressed:
    ``declare_size=False`` leaves the content size out of the frame header (what ``zstd -c`` on a pipe
    and streaming encoders write); ``frames > 1`` splits it into that many concatenated frames."""
    comp = zstandard.ZstdCompressor(level=3, write_content_size=declare_size)
    cuts = [len(payload) * i // frames for i in range(frames + 1)]
    body = b"".join(_compress_stream(comp, [payload[a:b]], b - a, declare_size)
                    for a, b in itertools.pairwise(cuts))
    return _PREFIX.pack(MAGIC, WIRE_VERSION, FLAG_ZSTD) + body


def recompressed(event: Event, *, declare_size: bool = True, frames: int = 1) -> bytes:
    """``event`` encoded, its payload re-compressed as :func:`zstd_record` says."""
    return zstd_record(encode(event)[_PREFIX.size :], declare_size=declare_size, frames=frames)


def bomb(decoded_bytes: int, *, declare_size: bool, noise_every: int = 0, seed: int = 0) -> bytes:
    """A prompt event (valid header) whose token array is ``decoded_bytes`` mostly-zero bytes, zstd-compressed.

    ``noise_every`` > 0 puts a random token every that many tokens (lower ratio: ~1,000:1 at 2,500);
    0 gives zstd's ceiling (~32,000:1). The array is generated and compressed in 1 MiB steps.
    """
    n_tokens = decoded_bytes // 4
    header = {
        "schema_version": 1, "kind": "prompt", "event_id": str(uuid.uuid4()), "execution_id": str(uuid.uuid4()),
        "seq": 1, "created_at": 0.0, "fields": {"parent": None, "source": "prompt"},
        "arrays": [["token_ids", "<i4", n_tokens]],
    }
    head = json.dumps(header, separators=(",", ":")).encode()
    rng = np.random.default_rng(seed)

    def chunks() -> Iterator[bytes]:
        yield struct.pack("<I", len(head)) + head
        done = 0
        while done < n_tokens:
            n = min(_STEP // 4, n_tokens - done)
            block = np.zeros(n, dtype="<i4")
            if noise_every:
                picks = block[(-done) % noise_every :: noise_every]
                block[(-done) % noise_every :: noise_every] = rng.integers(1, 2**31 - 1, size=picks.size)
            yield block.tobytes()
            done += n

    total = 4 + len(head) + 4 * n_tokens
    comp = zstandard.ZstdCompressor(level=3, write_content_size=declare_size)
    return _PREFIX.pack(MAGIC, WIRE_VERSION, FLAG_ZSTD) + _compress_stream(comp, chunks(), total, declare_size)


def _compress_stream(comp: zstandard.ZstdCompressor, parts: Iterable[bytes], total: int, declare_size: bool) -> bytes:
    obj = comp.compressobj(size=total if declare_size else -1)
    out = [obj.compress(part) for part in parts]
    out.append(obj.flush())
    return b"".join(out)


__all__ = ["bomb", "recompressed", "zstd_record"]
