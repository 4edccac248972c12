"""Decompression is bounded by the event limit: streamed zstd frames decode, bombs are refused, memory stays flat."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from sapwood.ingest.poison import bomb, recompressed, zstd_record
from sapwood.platform.codec import decode as decode_event
from sapwood.platform.codec import encode, payload_size
from sapwood.platform.errors import DecodeError, PayloadTooLargeError, ValidationError
from sapwood.platform.events import Prompt
from tests.support.histories import small_execution


@pytest.mark.parametrize(("declare_size", "frames"), [(True, 1), (False, 1), (False, 4), (True, 3)])
def test_streamed_and_multi_frame_payloads_decode_exactly(declare_size: bool, frames: int) -> None:
    for ev in small_execution(5).events:
        got = decode_event(recompressed(ev, declare_size=declare_size, frames=frames))
        assert got.event_id == ev.event_id
        assert got.scalar_fields() == ev.scalar_fields()
        for name, arr in ev.array_fields().items():
            np.testing.assert_array_equal(got.array_fields()[name], arr)


def _prompt_of_payload_bytes(n: int) -> tuple[Prompt, int]:
    """A prompt whose uncompressed payload is exactly ``n`` bytes (the header pads the rest)."""
    ev = Prompt(execution_id="4f0e7a3c-5b1d-4c1e-9a57-0d3f8f1e2a10", seq=1,
                token_ids=np.full(1000, 7, dtype=np.int32), source="p")  # not the default: in the header
    base = len(encode(ev)) - 6
    ev.source = "p" * (n - base + len(ev.source))
    size = len(encode(ev)) - 6
    assert size == n
    return ev, size


@pytest.mark.parametrize("declare_size", [True, False])
def test_limit_is_inclusive_on_the_decoded_payload(declare_size: bool) -> None:
    ev, size = _prompt_of_payload_bytes(6000)
    data = recompressed(ev, declare_size=declare_size)
    assert len(data) < 1500, "the record itself is small; only what it inflates to counts"
    assert decode_event(data, max_bytes=size).event_id == ev.event_id
    with pytest.raises(PayloadTooLargeError, match="max_bytes=5,999") as info:
        decode_event(data, max_bytes=size - 1)
    assert info.value.reason == "too_large"
    plain = encode(ev)
    assert decode_event(plain, max_bytes=size).event_id == ev.event_id
    with pytest.raises(PayloadTooLargeError):
        decode_event(plain, max_bytes=size - 1)
    assert payload_size(data) == (size if declare_size else None)


def test_corrupt_frames_are_decode_errors_not_too_large() -> None:
    data = zstd_record(b"\x10\x00\x00\x00" + b"x" * 2000, declare_size=False)
    broken = data[:20] + bytes(b ^ 0x5A for b in data[20:40]) + data[40:]
    with pytest.raises(DecodeError) as info:
        decode_event(broken)
    assert info.value.reason == "decode"
    with pytest.raises(DecodeError, match="expected zstd frames"):
        decode_event(data[:6] + b"not zstd at all")


@pytest.mark.parametrize(("decoded", "noise", "min_ratio"), [(8 << 20, 2500, 1000), (256 << 20, 0, 30_000)])
@pytest.mark.parametrize("declare_size", [True, False])
def test_bombs_are_too_large(decoded: int, noise: int, min_ratio: int, declare_size: bool) -> None:
    data = bomb(decoded, declare_size=declare_size, noise_every=noise)
    assert decoded / len(data) >= min_ratio
    with pytest.raises(PayloadTooLargeError):
        decode_event(data, max_bytes=1_000_000)


_CHILD = textwrap.dedent("""
    import json, resource, sys
    from pathlib import Path
    from sapwood.platform.codec import decode
    from sapwood.platform.errors import PayloadTooLargeError
    def peak_kib():  # VmHWM: ru_maxrss keeps the forking parent's peak across exec
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    data, limit = Path(sys.argv[1]).read_bytes(), sys.argv[2]
    before = peak_kib()
    try:
        decode(data, max_bytes=None if limit == "none" else int(limit), validate=False)
        outcome = "decoded"
    except PayloadTooLargeError:
        outcome = "too_large"
    after = peak_kib()
    print(json.dumps({"record": len(data), "grew_kib": after - before, "outcome": outcome}))
""")


def _peak_growth(tmp: Path, decoded: int, noise: int, declare: bool, limit: str) -> dict[str, int | str]:
    """Peak-RSS growth (KiB) of a fresh process decoding the bomb (built here, read from a file there)."""
    record = tmp / "record.bin"
    record.write_bytes(bomb(decoded, declare_size=declare, noise_every=noise))
    out = subprocess.run([sys.executable, "-c", _CHILD, str(record), limit],
                         capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.parametrize(("decoded", "noise"), [(8 << 20, 2500), (256 << 20, 0)], ids=["1000to1", "30000to1"])
@pytest.mark.parametrize("declare_size", [True, False], ids=["declared", "streamed"])
def test_peak_memory_of_a_bomb_stays_near_the_limit(tmp_path: Path, decoded: int, noise: int,
                                                     declare_size: bool) -> None:
    got = _peak_growth(tmp_path, decoded, noise, declare_size, "1000000")
    assert got["outcome"] == "too_large"
    assert int(got["grew_kib"]) < 16 * 1024, f"peak RSS grew {got['grew_kib']} KiB decoding a bomb with a 1 MB limit"


def test_the_memory_probe_sees_an_unbounded_inflate(tmp_path: Path) -> None:
    """Control: the same probe without a limit sees the 64 MiB the frame inflates to."""
    got = _peak_growth(tmp_path, 64 << 20, 0, True, "none")
    assert got["outcome"] == "decoded"
    assert int(got["grew_kib"]) > 60 * 1024, got


def test_a_header_without_created_at_is_refused_with_a_clear_error() -> None:
    ev = small_execution(6).events[1]
    data = encode(ev)
    (n,) = struct.unpack_from("<I", data, 6)
    header = json.loads(data[10 : 10 + n])
    del header["created_at"]
    head = json.dumps(header).encode()
    broken = data[:6] + struct.pack("<I", len(head)) + head + data[10 + n :]
    with pytest.raises(ValidationError, match="created_at must be a finite number"):
        decode_event(broken)
