"""Bounded decompression of Kafka record batches (kafka-python 3.0).

A producer can compress a whole record *batch* (``compression.type`` zstd or gzip); the broker bounds the
compressed size only and kafka-python inflates the batch in memory before ingest sees a record, so a
1 MB batch of zeros would demand ~32 GB. :func:`install` replaces kafka-python's batch decompression with
one that stops past ``max_batch_bytes`` and raises :class:`BatchTooLargeError` naming the partition and the
batch's offsets; the service then dead-letters those offsets as ``too_large`` and seeks past them.
Codecs other than zstd and gzip keep kafka-python's own decoder (lz4 and snappy are optional there).
"""

from __future__ import annotations

import threading
import zlib
from collections.abc import Iterator
from typing import Any

from sapwood.platform.codec import inflate
from sapwood.platform.errors import PayloadTooLargeError

_lock = threading.Lock()
_installed = False
#: The bound of the consumers polled from this thread (record batches are inflated by ``poll()``'s caller).
_local = threading.local()
_STEP = 1 << 20


class BatchTooLargeError(Exception):
    """A compressed record batch inflates past the bound; ``partition`` is set by the fetcher hook."""

    def __init__(self, base_offset: int, last_offset: int, limit: int, codec: str) -> None:
        super().__init__(f"a {codec} record batch (offsets {base_offset}..{last_offset}) inflates past "
                         f"max_batch_bytes={limit:,}")
        self.base_offset, self.last_offset, self.limit, self.codec = base_offset, last_offset, limit, codec
        self.partition: Any = None


def _gunzip(data: memoryview, limit: int) -> bytes | None:
    """``data`` gunzipped, or None past ``limit`` bytes."""
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    parts, total, rest = [], 0, bytes(data)
    while rest and not d.eof:
        chunk = d.decompress(rest, min(_STEP, limit + 1 - total))
        parts.append(chunk)
        total += len(chunk)
        if total > limit:
            return None
        rest = d.unconsumed_tail
    return b"".join(parts)


def install(max_batch_bytes: int) -> None:
    """Bound every zstd/gzip batch that consumers polled from the calling thread inflate by ``max_batch_bytes``
    (other threads keep kafka-python's unbounded decoding unless they call this too)."""
    global _installed
    from kafka.consumer.fetcher import Fetcher
    from kafka.record.default_records import DefaultRecordBatch

    _local.limit = max_batch_bytes
    with _lock:
        if _installed:
            return
        _installed = True
        original = DefaultRecordBatch._maybe_uncompress
        unpack = Fetcher.PartitionRecords._unpack_records

        def bounded_uncompress(self: Any) -> None:
            codec = self.compression_type
            limit = getattr(_local, "limit", None)
            if self._decompressed or limit is None or codec not in (self.CODEC_ZSTD, self.CODEC_GZIP):
                original(self)
                return
            data = memoryview(self._buffer)[self._pos :]
            name = "zstd" if codec == self.CODEC_ZSTD else "gzip"
            if codec == self.CODEC_ZSTD:
                try:
                    out: bytes | None = inflate(data, limit)
                except PayloadTooLargeError:
                    out = None
            else:
                out = _gunzip(data, limit)
            if out is None:
                raise BatchTooLargeError(self.base_offset, self.last_offset, limit, name)
            self._buffer = bytearray(out)
            self._pos = 0
            self._decompressed = True

        def unpack_naming_partition(self: Any, tp: Any, *args: Any) -> Iterator[Any]:
            try:
                yield from unpack(self, tp, *args)
            except BatchTooLargeError as exc:
                exc.partition = tp
                raise

        DefaultRecordBatch._maybe_uncompress = bounded_uncompress
        Fetcher.PartitionRecords._unpack_records = unpack_naming_partition


__all__ = ["BatchTooLargeError", "install"]
