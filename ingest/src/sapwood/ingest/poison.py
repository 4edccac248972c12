"""Records a producer we did not write might send: the inputs of the fault campaign and its tests.

:func:`catalogue` gives one poison of every kind with the dead-letter reason ingest must give it
(``""``: a valid record ingest must apply, e.g. streamed zstd frames). Bombs are built by streaming
zeros through a zstd compressor, so a 30,000:1 record costs ~1 MB of memory to make.
"""

from __future__ import annotations

import copy
import itertools
import json
import struct
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import zstandard

from sapwood.platform.codec import FLAG_ZSTD, MAGIC, WIRE_VERSION, encode
from sapwood.platform.events import Event, ExecutionStarted, Fork, ModelCall
from sapwood.platform.writer import ExecutionWriter

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


@dataclass
class Poison:
    """Records of one fresh execution whose last record must be dead-lettered with ``reason``; the
    events before it are valid (``valid``: their ids, applied as usual)."""

    name: str
    reason: str
    records: list[bytes]
    key: bytes
    valid: list[str] = field(default_factory=list)


def _writer(seed: int, vocab_size: int | None = 1000) -> ExecutionWriter:
    w = ExecutionWriter(run_id="chaos-poison", task_id=f"poison-{seed}", vocab_size=vocab_size)
    w.start()
    root = w.prompt(np.arange(20, dtype=np.int32) + seed % 50)
    w.call(root.node_id, [1, 2], [3, 4], [-0.1, -0.2])
    return w


def _poison(name: str, reason: str, w: ExecutionWriter, bad: bytes, *, valid: list[Event] | None = None) -> Poison:
    ok = w.events if valid is None else valid
    return Poison(name, reason, [encode(e) for e in ok] + [bad], w.execution_id.encode(), [e.event_id for e in ok])


def _rewrite_header(data: bytes, mutate: Callable[[dict[str, Any]], None]) -> bytes:
    (n,) = struct.unpack_from("<I", data, _PREFIX.size)
    header = json.loads(data[_PREFIX.size + 4 : _PREFIX.size + 4 + n])
    mutate(header)
    head = json.dumps(header).encode()
    return data[: _PREFIX.size] + struct.pack("<I", len(head)) + head + data[_PREFIX.size + 4 + n :]


def catalogue(seed: int, *, max_event_bytes: int = 1_000_000) -> list[Poison]:
    """One poison of every kind ingest tells apart, each in its own execution (``seed`` makes them unique)."""
    out: list[Poison] = []
    w = _writer(seed)
    out.append(Poison("garbage", "decode", [b"\x00\x01 not a sapwood record %d" % seed], w.execution_id.encode()))
    out.append(_poison("truncated", "decode", w, encode(w.events[-1])[:-5], valid=w.events[:-1]))
    w = _writer(seed + 1)
    future = ExecutionStarted(run_id="r", task_id="t", execution_id=w.execution_id, seq=0, schema_version=99)
    out.append(Poison("schema_version", "schema_version", [encode(future)], w.execution_id.encode()))
    out.append(Poison("bomb_streamed", "too_large", [bomb(256 << 20, declare_size=False, seed=seed)],
                      w.execution_id.encode()))
    out.append(Poison("bomb_declared", "too_large", [bomb(8 << 20, declare_size=True, noise_every=2500, seed=seed)],
                      w.execution_id.encode()))
    out.append(Poison("oversized", "too_large", [b"SPWD\x01\x00" + bytes(max_event_bytes + 100)],
                      w.execution_id.encode()))
    w = _writer(seed + 2)
    call = w.events[-1]
    assert isinstance(call, ModelCall)
    out.append(_poison("wrong_dtype", "dtype", w, _rewrite_header(encode(call), lambda h: h["arrays"][0].__setitem__(
        1, "<u4")), valid=w.events[:-1]))
    w = _writer(seed + 3)
    call = w.events[-1]
    assert isinstance(call, ModelCall)
    call.input_digest = "0" * 32
    out.append(_poison("digest_mismatch", "digest_mismatch", w, encode(call), valid=w.events[:-1]))
    w = _writer(seed + 4)
    gap = copy.copy(w.events[-1])
    gap.seq = (gap.seq or 0) + 2
    gap.event_id = str(uuid.uuid4())
    out.append(_poison("sequence_gap", "sequence", w, encode(gap)))
    w = _writer(seed + 5)
    orphan = Fork(execution_id=w.execution_id, seq=len(w.events), at_node=str(uuid.uuid4()), branches=2)
    out.append(_poison("unknown_parent", "unknown_reference", w, encode(orphan)))
    w = _writer(seed + 6, vocab_size=100)
    high = copy.copy(w.events[-1])
    assert isinstance(high, ModelCall)
    high.output_ids = np.array([5, 500], dtype=np.int32)
    out.append(_poison("token_range", "token_range", w, encode(high), valid=w.events[:-1]))
    w = _writer(seed + 7)
    positive = copy.copy(w.events[-1])
    assert isinstance(positive, ModelCall)
    positive.output_logprobs = np.array([0.5, -0.1], dtype=np.float32)
    out.append(_poison("positive_logprob", "dtype", w, encode(positive), valid=w.events[:-1]))
    w = _writer(seed + 8)
    short = copy.copy(w.events[-1])
    assert isinstance(short, ModelCall)
    short.output_logprobs = np.array([-0.1], dtype=np.float32)
    out.append(_poison("length_mismatch", "length_mismatch", w, encode(short), valid=w.events[:-1]))
    w = _writer(seed + 9)
    one_way = Fork(execution_id=w.execution_id, seq=len(w.events), at_node=w.events[-1].output_node_id,  # type: ignore[attr-defined]
                   branches=1)
    out.append(_poison("invalid_field", "invalid", w, encode(one_way)))
    w = _writer(seed + 10)
    flipped = copy.copy(w.events[1])
    flipped.token_ids = flipped.token_ids.copy()  # type: ignore[attr-defined]
    flipped.token_ids[0] += 1  # type: ignore[attr-defined]
    out.append(_poison("conflicting_replay", "conflict", w, encode(flipped)))
    too_long = ExecutionWriter(run_id="r", task_id="t" * 257)  # the task_id column holds 256 (events.limits)
    too_long.start()
    out.append(Poison("task_id_too_long", "invalid", [encode(too_long.events[0])], too_long.execution_id.encode()))
    nul = ExecutionWriter(run_id="r", task_id="t")  # valid event; PostgreSQL's JSON refuses U+0000
    nul.start()
    nul.events[0].metadata = {"note": "a\x00b"}  # type: ignore[attr-defined]
    out.append(Poison("refused_by_database", "store_error", [encode(nul.events[0])], nul.execution_id.encode()))
    w = _writer(seed + 11)
    out.append(Poison("streamed_valid", "", [recompressed(e, declare_size=False) for e in w.events],
                      w.execution_id.encode(), [e.event_id for e in w.events]))
    return out


__all__ = ["Poison", "bomb", "catalogue", "recompressed", "zstd_record"]
