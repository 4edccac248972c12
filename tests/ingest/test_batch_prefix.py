"""The dead letters of a batch past the inflation bound keep the key and a bounded value prefix of each
record that starts inside the bound (:mod:`sapwood.ingest.batch_prefix`)."""

from __future__ import annotations

from kafka.record.default_records import DefaultRecordBase, DefaultRecordBatchBuilder

from sapwood.ingest.batch_prefix import records_in_prefix


def _records_section(records: list[tuple[bytes | None, bytes]]) -> bytes:
    """The records section (after the 61-byte v2 batch header) of an uncompressed batch of ``records``."""
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=-1,
                                        producer_epoch=-1, base_sequence=-1, batch_size=1 << 24)
    for offset, (key, value) in enumerate(records):
        builder.append(offset, timestamp=None, key=key, value=value, headers=[])
    return bytes(builder.build())[DefaultRecordBase.HEADER_STRUCT.size :]


def test_every_record_of_a_whole_section_is_read_with_its_key() -> None:
    section = _records_section([(b"k0", b"v0"), (None, b"v1" * 10), (b"k2", b"")])
    got = records_in_prefix(section, 100, 1 << 20)
    assert {o: (r.key, r.value, r.truncated) for o, r in got.items()} == {
        100: (b"k0", b"v0", False), 101: (None, b"v1" * 10, False), 102: (b"k2", b"", False)}


def test_a_cut_prefix_keeps_the_records_that_start_in_it_and_bounds_values() -> None:
    section = _records_section([(b"first", b"a" * 50), (b"big", b"b" * 5000), (b"late", b"c")])
    cut = section[: len(section) - 200]  # inside the big value: the last record is past the prefix
    got = records_in_prefix(cut, 0, 1000)
    assert sorted(got) == [0, 1]
    assert (got[0].key, got[0].value, got[0].truncated) == (b"first", b"a" * 50, False)
    assert (got[1].key, got[1].value, got[1].truncated) == (b"big", b"b" * 1000, True)
    assert len(records_in_prefix(cut, 0, 10_000)[1].value) < 5000


def test_garbage_and_empty_prefixes_give_no_record_and_raise_nothing() -> None:
    assert records_in_prefix(b"", 0, 10) == {}
    assert records_in_prefix(b"\xff" * 40, 0, 10) == {}
    assert records_in_prefix(_records_section([(b"key", b"v")])[:3], 0, 10) == {}
