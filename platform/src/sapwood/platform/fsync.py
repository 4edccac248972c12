"""Durable renames: after ``os.replace`` into a folder, the folder's entry is forced to the disk too."""

from __future__ import annotations

import os
from pathlib import Path


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    """``fsync`` a folder, so a rename into it survives a power loss (POSIX)."""
    fd = os.open(Path(directory), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


__all__ = ["fsync_dir"]
