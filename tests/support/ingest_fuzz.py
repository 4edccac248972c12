"""The fuzz oracle for ingest's record decoder and event validator, shared by the CI property tests
(``tests/ingest/test_fuzz_ingest.py``) and the long coverage-guided run (``bench/fuzz_ingest.py``).

:func:`check_record` feeds one Kafka record value through what ingest does before apply (the record
decoder, then each event's static validation) and asserts the contract: no exception escapes, the
record is either one valid event or one dead letter with a known reason, no letter comes from the
decoder's catch-all (an exception the codec did not anticipate), and the peak memory and time of the
record stay under :data:`MAX_PEAK_BYTES` and :data:`MAX_SECONDS`.
"""

from __future__ import annotations

import builtins
import re
import time
import tracemalloc
from dataclasses import dataclass

from kafka import TopicPartition

from sapwood.ingest.record_decoder import SkippedRecord, decode_records
from sapwood.platform.errors import ValidationError

#: The record limit the fuzz runs under (smaller than the default 1,000,000 so bombs are cheap to try).
MAX_EVENT_BYTES = 64 * 1024
#: Peak traced allocation while handling one record: a few copies of the limit plus a fixed allowance.
MAX_PEAK_BYTES = 8 * MAX_EVENT_BYTES + (4 << 20)
#: Wall time for one record (generous: the CI machine is shared; a typical record takes well under 1 ms).
MAX_SECONDS = 0.5
#: Every reason docs/wire-format.md §8 lists.
REASONS = frozenset({"decode", "too_large", "schema_version", "dtype", "invalid", "length_mismatch",
                     "token_range", "unknown_reference", "digest_mismatch", "sequence", "conflict", "store_error"})
_TP = TopicPartition("fuzz", 0)
_BUILTIN_ERROR = re.compile(r"^([A-Za-z]+): ")


@dataclass(frozen=True)
class Outcome:
    """What became of one record: ``"event"`` or a dead letter's reason; peak bytes and seconds."""

    result: str
    peak_bytes: int
    seconds: float


def _unanticipated(message: str) -> bool:
    """Whether a ``decode`` letter came from the decoder's catch-all for a builtin exception."""
    m = _BUILTIN_ERROR.match(message)
    return m is not None and isinstance(getattr(builtins, m.group(1), None), type)


def check_record(value: bytes, *, trace_memory: bool = True) -> Outcome:
    """Run ``value`` through decode + validate; raise AssertionError when the contract is broken."""
    if trace_memory:
        tracemalloc.start()
    start = time.perf_counter()
    try:
        decoded = decode_records({_TP: [SkippedRecord(0, value, b"key")]}, max_event_bytes=MAX_EVENT_BYTES)
        letters = [(lt.reason, lt.message) for lt in decoded.letters]
        results = [r for r, _ in letters]
        for event in decoded.events:
            try:
                event.validate()
                results.append("event")
            except ValidationError as exc:
                letters.append((exc.reason, str(exc)))
                results.append(exc.reason)
    finally:
        seconds = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1] if trace_memory else 0
        if trace_memory:
            tracemalloc.stop()
    assert len(results) == 1, f"one record gave {results}, expected one event or one dead letter"
    for reason, message in letters:
        assert reason in REASONS, f"unknown dead-letter reason {reason!r} ({message})"
        assert message, f"a {reason} letter without a message"
        assert not (reason == "decode" and _unanticipated(message)), f"an unanticipated exception: {message}"
    assert peak <= MAX_PEAK_BYTES, f"{peak:,} bytes traced for one record of {len(value):,}, bound {MAX_PEAK_BYTES:,}"
    assert seconds <= MAX_SECONDS, f"{seconds:.3f} s for one record of {len(value):,} bytes, bound {MAX_SECONDS} s"
    return Outcome(results[0], peak, seconds)


__all__ = ["MAX_EVENT_BYTES", "MAX_PEAK_BYTES", "MAX_SECONDS", "REASONS", "Outcome", "check_record"]
