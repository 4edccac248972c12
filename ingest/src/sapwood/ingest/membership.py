"""Static group membership by default: an instance id derived from the host and a stable index.

A restarted ingest process that presents the same ``group.instance.id`` gets its partitions back at
once instead of waiting for the group to notice the old member is gone. The index is the lowest one
whose lock file this host has free (``flock``: released by the kernel when the process dies, even by
SIGKILL), so N processes on one host take 0..N-1 and a restarted one takes its old index again.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import socket
import tempfile
from pathlib import Path
from typing import IO

#: ``instance_id`` values that ask for a derived id, and those that ask for dynamic membership.
AUTO = "auto"
DYNAMIC = frozenset({"", "none", "dynamic"})
MAX_INDEX = 256


class InstanceLock:
    """A held instance id (``value``); :meth:`release` frees its index for the next process."""

    def __init__(self, value: str, handle: IO[bytes] | None) -> None:
        self.value = value
        self._handle = handle

    def release(self) -> None:
        if self._handle is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._handle, fcntl.LOCK_UN)
            self._handle.close()
            self._handle = None


def lock_dir() -> Path:
    return Path(os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()) / "sapwood-ingest"


def derive_instance_id(group: str, *, host: str | None = None, directory: Path | None = None) -> InstanceLock:
    """``<host>-<index>``: the lowest index of ``group`` on this host no live process holds."""
    host = re.sub(r"[^A-Za-z0-9._-]", "-", host or socket.gethostname())[:200]
    where = directory or lock_dir()
    where.mkdir(parents=True, exist_ok=True)
    tag = re.sub(r"[^A-Za-z0-9._-]", "_", group)[:100]
    for index in range(MAX_INDEX):
        handle = open(where / f"{tag}.{index}.lock", "ab")  # noqa: SIM115 - held until release()
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            continue
        return InstanceLock(f"sapwood-ingest-{host}-{index}", handle)
    raise RuntimeError(f"{MAX_INDEX} ingest processes of group {group!r} already run on {host}; "
                       "pass --instance-id to choose ids yourself")


def resolve_instance_id(configured: str | None, group: str) -> InstanceLock | None:
    """The id to join ``group`` with: None (dynamic) for None/''/'none', derived for 'auto', else as given."""
    if configured is None or configured.lower() in DYNAMIC:
        return None
    if configured.lower() == AUTO:
        return derive_instance_id(group)
    return InstanceLock(configured, None)


__all__ = ["AUTO", "InstanceLock", "derive_instance_id", "resolve_instance_id"]
