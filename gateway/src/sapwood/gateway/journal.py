"""The gateway's session journal: every event it records, on local disk before it is queued for the transport.

A killed gateway (``kill -9``, a crash) loses its process memory: the open sessions' executions, trees and
chains. The journal keeps what is needed to continue them: each event is appended (length-prefixed wire
bytes, :mod:`sapwood.platform.codec`) by :class:`JournaledTransport` before the background recorder queues
it, with one ``write`` to the OS (``fsync=True`` also forces it to the disk). A restarted gateway reads it
back (:meth:`SessionJournal.read`; a torn last record is dropped), continues each session whose execution
has not finished (:func:`open_executions`), sends every journaled event again (ingest keeps an event id
once, so copies that had arrived are not stored twice) and, once those are delivered, rewrites the journal
with the open sessions' events only (decision 0051 in the docs).

Risk window: an event whose ``write`` returned survives a killed process (the OS holds it); a power loss
can lose what the OS had not written back, unless ``fsync``. An event built but not yet written (a few
microseconds, under the gateway's lock, before the client can be answered) is lost with the process.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable
from pathlib import Path

from sapwood.platform import codec
from sapwood.platform.errors import SapwoodError
from sapwood.platform.events import Event, ExecutionFinished, ExecutionStarted
from sapwood.platform.fsync import fsync_dir
from sapwood.rollout.transports import Transport

_LEN = struct.Struct("<I")


class SessionJournal:
    """An append-only file of length-prefixed encoded events (``fsync``: force each append to the disk)."""

    def __init__(self, path: str | os.PathLike[str], *, fsync: bool = False) -> None:
        self.path = Path(path)
        self.fsync = fsync
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd: int | None = None

    def read(self) -> list[Event]:
        """The journaled events in the order they were appended; a torn last record is left out."""
        if not self.path.exists():
            return []
        data = memoryview(self.path.read_bytes())
        events: list[Event] = []
        at = 0
        while at + _LEN.size <= len(data):
            (n,) = _LEN.unpack_from(data, at)
            if at + _LEN.size + n > len(data):
                break  # the process died inside this write
            try:
                events.append(codec.decode(data[at + _LEN.size : at + _LEN.size + n], max_bytes=None))
            except SapwoodError:
                break  # a record cut short and overwritten: nothing after it is trusted
            at += _LEN.size + n
        return events

    def rewrite(self, events: Iterable[Event]) -> None:
        """Replace the journal's content with ``events`` (a new file renamed over the old one), then
        append to it."""
        self.close()
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "wb") as fh:
            for event in events:
                fh.write(_record(event))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)
        fsync_dir(self.path.parent)

    def append(self, event: Event) -> None:
        """Append one event with one ``write`` (atomic against other appends: ``O_APPEND``)."""
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        record = _record(event)
        written = os.write(self._fd, record)
        if written != len(record):
            raise OSError(f"journal {self.path}: wrote {written} of {len(record)} bytes")
        if self.fsync:
            os.fsync(self._fd)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _record(event: Event) -> bytes:
    data = codec.encode(event)
    return _LEN.pack(len(data)) + data


def open_executions(events: Iterable[Event]) -> dict[str, list[Event]]:
    """Session id -> its execution's events in sequence order, for each gateway session (its
    ``execution_started`` names ``session_id``) whose execution has not finished. Copies of one event
    (sent again after an earlier restart) count once."""
    by_execution: dict[str, dict[int, Event]] = {}
    for event in events:
        by_execution.setdefault(event.execution_id or "", {}).setdefault(int(event.seq or 0), event)
    out: dict[str, list[Event]] = {}
    for seqs in by_execution.values():
        chain = [seqs[k] for k in sorted(seqs)]
        start = chain[0]
        if not isinstance(start, ExecutionStarted) or "session_id" not in start.metadata:
            continue
        if any(isinstance(e, ExecutionFinished) for e in chain):
            continue
        if [e.seq for e in chain] != list(range(len(chain))):
            continue  # a gap: the journal lost an event in the middle; the session starts afresh
        out[str(start.metadata["session_id"])] = chain
    return out


class JournaledTransport(Transport):
    """Appends each event to ``journal``, then hands it to ``inner`` (the gateway's background recorder)."""

    def __init__(self, inner: Transport, journal: SessionJournal) -> None:
        super().__init__()
        self.inner = inner
        self.journal = journal
        self.max_event_bytes = inner.max_event_bytes

    def send(self, event: Event) -> None:
        self.journal.append(event)
        self.inner.send(event)

    def flush(self, timeout: float | None = None) -> None:
        self.inner.flush(timeout)

    def close(self, timeout: float | None = None) -> None:
        self.journal.close()


__all__ = ["JournaledTransport", "SessionJournal", "open_executions"]
