"""Bounded decompression of Kafka record batches (kafka-python 3.0).

A producer can compress a whole record *batch* (``compression.type`` zstd or gzip); the broker bounds the
compressed size only and kafka-python inflates the batch in memory before ingest sees a record, so a
1 MB batch of zeros would demand ~32 GB. :func:`install` replaces kafka-python's batch decompression with
one that stops past ``max_batch_bytes`` and raises :class:`BatchTooLargeError` naming the partition and the
batch's offsets; the service then dead-letters those offsets as ``too_large`` and seeks past them. The
error keeps, per offset, the record key and a bounded value prefix of each record that starts within the
first ``max_batch_bytes`` of the inflated batch (:mod:`batch_prefix`), so the letters keep both.
Codecs other than zstd and gzip (lz4, snappy: dependencies of the base install) keep kafka-python's own
decoder. A batch that no decoder can inflate (a codec id nobody knows, a corrupt block) raises
:class:`UndecodableBatchError`; the service dead-letters its offsets as ``decode`` and moves on, instead of
failing the same poll forever.
"""

from __future__ import annotations

import threading
import zlib
from collections.abc import Iterator
from typing import Any

import zstandard

from sapwood.ingest.batch_prefix import PrefixRecord, records_in_prefix
from sapwood.platform.codec import inflate
from sapwood.platform.errors import PayloadTooLargeError

_lock = threading.Lock()
_installed = False
#: The bound of the consumers polled from this thread (record batches are inflated by ``poll()``'s caller).
_local = threading.local()
_STEP = 1 << 20


class UndecodableBatchError(Exception):
    """A record batch ingest cannot read, whatever its records hold; ``reason`` is the dead letters' reason
    for each of its offsets, ``partition`` is set by the fetcher hook."""

    reason = "decode"

    def __init__(self, base_offset: int, last_offset: int, message: str) -> None:
        super().__init__(message)
        self.base_offset, self.last_offset = base_offset, last_offset
        self.partition: Any = None


class BatchTooLargeError(UndecodableBatchError):
    """A compressed record batch inflates past the bound."""

    reason = "too_large"

    def __init__(self, base_offset: int, last_offset: int, limit: int, codec: str,
                 records: dict[int, PrefixRecord] | None = None) -> None:
        super().__init__(base_offset, last_offset, f"a {codec} record batch (offsets {base_offset}..{last_offset}) "
                         f"inflates past max_batch_bytes={limit:,}")
        self.limit, self.codec = limit, codec
        self.records: dict[int, PrefixRecord] = records or {}
        """offset → key and value prefix of each record readable within the bound."""


def _inflated_prefix(data: memoryview, zstd: bool, limit: int) -> bytes:
    """The first ``limit`` bytes (at most) of the inflated batch ``data``; b"" when even that fails."""
    try:
        if zstd:
            return zstandard.ZstdDecompressor().stream_reader(data, read_across_frames=True).read(limit)
        return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(bytes(data), limit)
    except (zstandard.ZstdError, zlib.error):
        return b""


def _decode_with(original: Any, batch: Any) -> None:
    """kafka-python's own decompression of ``batch``; any failure becomes :class:`UndecodableBatchError`."""
    try:
        original(batch)
    except Exception as exc:
        raise UndecodableBatchError(
            batch.base_offset, batch.last_offset,
            f"record batch (offsets {batch.base_offset}..{batch.last_offset}, codec id {batch.compression_type}) "
            f"cannot be decompressed: {type(exc).__name__}: {exc}") from exc


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


def install(max_batch_bytes: int, letter_bytes: int = 1 << 20) -> None:
    """Bound every zstd/gzip batch that consumers polled from the calling thread inflate by ``max_batch_bytes``
    (other threads keep kafka-python's unbounded decoding unless they call this too); the letters of a batch
    past the bound keep at most ``letter_bytes`` of each record's value."""
    global _installed
    from kafka.consumer.fetcher import Fetcher
    from kafka.record.default_records import DefaultRecordBatch

    _local.limit = max_batch_bytes
    _local.letter_bytes = letter_bytes
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
                _decode_with(original, self)
                return
            data = memoryview(self._buffer)[self._pos :]
            name = "zstd" if codec == self.CODEC_ZSTD else "gzip"
            if codec == self.CODEC_ZSTD:
                try:
                    out: bytes | None = inflate(data, limit)
                except PayloadTooLargeError:
                    out = None
                except Exception as exc:
                    raise UndecodableBatchError(self.base_offset, self.last_offset,
                                                f"zstd record batch (offsets {self.base_offset}..{self.last_offset}) "
                                                f"is corrupt: {type(exc).__name__}: {exc}") from exc
            else:
                try:
                    out = _gunzip(data, limit)
                except zlib.error as exc:
                    raise UndecodableBatchError(self.base_offset, self.last_offset,
                                                f"gzip record batch (offsets {self.base_offset}..{self.last_offset}) "
                                                f"is corrupt: {exc}") from exc
            if out is None:
                prefix = _inflated_prefix(data, codec == self.CODEC_ZSTD, limit)
                records = records_in_prefix(prefix, self.base_offset, getattr(_local, "letter_bytes", 1 << 20))
                raise BatchTooLargeError(self.base_offset, self.last_offset, limit, name, records)
            self._buffer = bytearray(out)
            self._pos = 0
            self._decompressed = True

        def unpack_naming_partition(self: Any, tp: Any, *args: Any) -> Iterator[Any]:
            try:
                yield from unpack(self, tp, *args)
            except UndecodableBatchError as exc:
                exc.partition = tp
                raise

        DefaultRecordBatch._maybe_uncompress = bounded_uncompress
        Fetcher.PartitionRecords._unpack_records = unpack_naming_partition


__all__ = ["BatchTooLargeError", "UndecodableBatchError", "install"]
