"""A store transport the gateway tests can hold, refuse and release, with every wait bounded.

:class:`HeldTransport` applies events to an embedded store one by one; while ``down`` is set it
refuses them (a broker that is unreachable), while ``gate`` is clear it holds them (a slow commit).
Its waits end after ``hold_s`` seconds with an error, and :func:`released` opens everything when a
test block ends (also when an assertion inside it failed), so a broken mechanism fails the test fast
instead of leaving the gateway's drain waiting on a held transport.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from sapwood.platform.events import Event, ModelCall
from sapwood.platform.store import Store
from sapwood.rollout.transports import InProcessTransport, TransportError

#: Seconds a held event waits for the test to release it before the transport gives up on it.
HOLD_S = 20.0


class HeldTransport(InProcessTransport):
    """Commits each event in its own transaction; ``log`` gets ``"commit"`` after each model call."""

    def __init__(self, store: Store, *, hold_s: float = HOLD_S) -> None:
        super().__init__(store, batch_size=1)
        self.down = threading.Event()
        self.gate = threading.Event()
        self.gate.set()
        self.reached = threading.Event()
        self.hold_s = hold_s
        self.log: list[str] = []

    def send(self, event: Event) -> None:
        self.reached.set()
        if self.down.is_set():
            raise TransportError("broker unreachable (test)")
        if not self.gate.wait(self.hold_s):
            raise TransportError(f"the test held the event for more than {self.hold_s} s")
        super().send(event)
        if isinstance(event, ModelCall):
            self.log.append("commit")

    def release(self) -> None:
        """Let every event through from now on."""
        self.down.clear()
        self.gate.set()


@contextlib.contextmanager
def released(transport: HeldTransport) -> Iterator[HeldTransport]:
    """Yield ``transport``; release it when the block ends, however it ends."""
    try:
        yield transport
    finally:
        transport.release()


__all__ = ["HOLD_S", "HeldTransport", "released"]
