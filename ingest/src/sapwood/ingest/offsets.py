"""Consumer offsets kept in the store, in the same transaction as the events they cover.

Thin functions over the platform's offset store (:mod:`sapwood.platform.storage.offsets`) for tools and
tests that read or seed offsets; the service goes through :class:`~sapwood.ingest.committer.OffsetCommitter`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from sqlalchemy.engine import Connection

from sapwood.platform.storage.offsets import offset_store


def load_offsets(conn: Connection, group: str, topic: str, partitions: Iterable[int] | None = None, *,
                 for_update: bool = False) -> dict[int, int]:
    """Stored next offsets by partition (partitions never committed are absent).

    ``for_update`` locks the rows until the transaction ends (PostgreSQL), so two ingest
    processes cannot both advance one partition from the same offset.
    """
    store = offset_store(conn)
    return (store.lock if for_update else store.read)(conn, group, topic, partitions)


def store_offsets(conn: Connection, group: str, topic: str, offsets: dict[int, int], *,
                  existing: Iterable[int] | Mapping[int, int]) -> None:
    """Write next offsets: compare-and-set the partitions in ``existing``, INSERT the others.

    ``existing`` is what :func:`load_offsets` returned (partition → offset: each must still be stored, else
    :class:`~sapwood.platform.storage.offsets.StaleOffsetError`) or just the partitions known to be stored.
    A concurrent INSERT of the same partition fails on the primary key; either aborts the whole
    transaction: the caller re-reads the offsets and re-seeks.
    """
    store = offset_store(conn)
    expected = existing if isinstance(existing, Mapping) else store.read(conn, group, topic, existing)
    store.advance(conn, group, topic, offsets, expected=expected)


__all__ = ["load_offsets", "store_offsets"]
