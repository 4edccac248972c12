"""Bounded zstd inflation for every frame shape: the step is fixed, whatever sizes the frames declare.

Each shape is checked for its exact output, and for the number of reads the inflation makes (at most one
per ``_INFLATE_STEP`` of output plus one per frame): a step taken from a declared size would make a tiny
first frame read the rest of the stream a byte or two at a time.
"""

from __future__ import annotations

import struct
from typing import Any

import pytest
import zstandard

from sapwood.platform import codec
from sapwood.platform.codec import inflate
from sapwood.platform.errors import DecodeError, PayloadTooLargeError

STEP = codec._INFLATE_STEP


def _frame(data: bytes, *, declare: bool = True) -> bytes:
    comp = zstandard.ZstdCompressor(level=3, write_content_size=declare)
    obj = comp.compressobj(size=len(data) if declare else -1)
    return obj.compress(data) + obj.flush()


def _skippable(payload: bytes) -> bytes:
    return struct.pack("<II", 0x184D2A50, len(payload)) + payload


def _declared_size_at(frame: bytes) -> tuple[int, int]:
    """(offset, width) of the frame-content-size field of a zstd frame header."""
    fhd = frame[4]
    single, dict_flag, fcs_flag = (fhd >> 5) & 1, fhd & 3, fhd >> 6
    pos = 5 + (0 if single else 1) + (0, 1, 2, 4)[dict_flag]
    return pos, ((1 if single else 0), 2, 4, 8)[fcs_flag]


def _lie(frame: bytes, declared: int) -> bytes:
    pos, width = _declared_size_at(frame)
    assert width == 2, "the test frames use the 2-byte size field (256..65791 bytes)"
    return frame[:pos] + struct.pack("<H", declared - 256) + frame[pos + width :]


class _CountingDecompressor:
    def __init__(self) -> None:
        self.reads = 0
        self.inner = zstandard.ZstdDecompressor()

    def stream_reader(self, source: Any, **kw: Any) -> Any:
        reader = self.inner.stream_reader(source, **kw)
        outer = self

        class Reader:
            def read(self, n: int) -> bytes:
                outer.reads += 1
                return bytes(reader.read(n))

        return Reader()


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> _CountingDecompressor:
    counting = _CountingDecompressor()
    monkeypatch.setattr(codec, "_decompressor", counting)
    return counting


ZEROS = bytes(8 * STEP)  # 8 MiB: compresses to a few hundred bytes


@pytest.mark.parametrize("shape", ["sized", "streamed", "multi_frame", "skippable", "tiny_first_frame"])
def test_each_shape_decodes_exactly_in_fixed_steps(shape: str, reads: _CountingDecompressor) -> None:
    if shape == "sized":
        frames, n_frames = _frame(ZEROS), 1
    elif shape == "streamed":
        frames, n_frames = _frame(ZEROS, declare=False), 1
    elif shape == "multi_frame":
        frames, n_frames = b"".join(_frame(ZEROS[i * STEP : (i + 1) * STEP]) for i in range(8)), 8
    elif shape == "skippable":
        frames, n_frames = _skippable(b"x" * 100) + _frame(ZEROS) + _skippable(b""), 3
    else:  # a first frame declaring 1 byte, then a streamed 8 MiB frame
        frames, n_frames = _frame(b"a") + _frame(ZEROS, declare=False), 2
    expected = (b"a" if shape == "tiny_first_frame" else b"") + ZEROS
    assert inflate(frames, len(expected)) == expected
    assert reads.reads <= len(expected) // STEP + n_frames + 2, f"{reads.reads} reads for {len(expected):,} bytes"


def test_a_tiny_first_frame_does_not_shrink_the_bound_check(reads: _CountingDecompressor) -> None:
    frames = _frame(b"a") + _frame(ZEROS, declare=False)
    with pytest.raises(PayloadTooLargeError, match="inflates past"):
        inflate(frames, 3 * STEP)
    assert reads.reads <= 6


def test_a_first_frame_declaring_more_than_the_bound_is_refused_before_inflating(reads: _CountingDecompressor) -> None:
    with pytest.raises(PayloadTooLargeError, match="declares"):
        inflate(_frame(ZEROS), len(ZEROS) - 1)
    assert reads.reads == 0


@pytest.mark.parametrize("direction", [-1, +1])
def test_a_frame_lying_about_its_size_either_way_is_corrupt(direction: int, reads: _CountingDecompressor) -> None:
    data = bytes(range(256)) * 20  # 5,120 bytes: the 2-byte size field
    lying = _lie(_frame(data), len(data) + direction * 1000)
    assert inflate(_frame(data), len(data)) == data
    with pytest.raises(DecodeError, match="corrupt zstd payload"):
        inflate(lying, 1 << 20)
    assert reads.reads <= 3


def test_a_stream_lying_low_about_a_bomb_stops_at_the_bound(reads: _CountingDecompressor) -> None:
    frames = _lie(_frame(bytes(4096)), 300) + _frame(ZEROS, declare=False)
    with pytest.raises((PayloadTooLargeError, DecodeError)):
        inflate(frames, 2 * STEP)
    assert reads.reads <= 4
