"""Execution versions pushed by the store: the interface the API's version reader talks to.

Where the backend can push (PostgreSQL through psycopg: migration 0003's trigger notifies every change
of an execution's ``last_seq``), :func:`sapwood.platform.storage.backends.version_channel` gives a
:class:`VersionChannel`; elsewhere it gives None and versions are read through the engine.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol


class VersionChannel(Protocol):
    """``last_seq`` queries on the calling event loop's own connections, and one notification listener."""

    async def last_seq(self, execution_id: str) -> int:
        """The execution's ``last_seq``; ``UnknownParentError`` when there is no such execution."""
        ...

    async def listen(self, *, live: Callable[[], None], notified: Callable[[str, int], None],
                     down: Callable[[], None]) -> bool:
        """One listening connection's life: ``live()`` once no commit can go unnoticed, ``notified(execution_id,
        last_seq)`` per change, ``down()`` at its end. False when the store cannot push (its trigger is
        missing); ``StoreUnavailableError`` when the connection fails."""
        ...

    async def close(self) -> None:
        """Close the query connections."""
        ...


__all__ = ["VersionChannel"]
