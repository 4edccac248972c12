"""A cell's device clock: work is charged modelled device seconds, laid end to end on the cell's timeline.

A cell stands for an accelerator: exclusive, so a busy cell cannot borrow an idle cell's capacity (on a
shared CPU the operating system would lend it). Each unit of work does its real computation and then
ends no earlier than the clock says: :meth:`DeviceClock.charge` reserves ``seconds`` on the timeline
from ``max(started_at, busy_until)`` and waits until the reservation's end. Charges from concurrent
threads of one cell are serialised (one device); charges on different cells are independent.

Concurrent decode calls on one cell share its device as one batched step: a step of ``k`` calls
costs ``decode_token_s + (k - 1) × batch_extra_s`` (:meth:`DeviceCosts.decode_step_s`), and each of
the ``k`` calls is charged its ``1/k`` share per token (× its ``decode_scale``), so ``k`` calls
decoding one token each occupy the device for exactly one batched step. A trained micro-batch costs
``train_microbatch_s``. The constants and how they were calibrated: ``docs/scheduler.md``
(*Device clocks*) and decision 0047.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["DeviceClock", "DeviceCosts"]


@dataclass(frozen=True)
class DeviceCosts:
    """Modelled device seconds: a decode step of one call, each extra call in a batched decode step,
    one trained micro-batch (the demo's figures: ``docs/scheduler.md``, *Device clocks*)."""

    decode_token_s: float = 0.0
    batch_extra_s: float = 0.0
    train_microbatch_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("decode_token_s", "batch_extra_s", "train_microbatch_s"):
            v = getattr(self, name)
            if not math.isfinite(v) or v < 0:
                raise ValueError(f"{name} must be finite and ≥ 0, got {v}")

    def decode_step_s(self, k: int) -> float:
        """Device seconds of one batched decode step of ``k`` ≥ 1 concurrent calls."""
        if k < 1:
            raise ValueError(f"a decode step has ≥ 1 call, got {k}")
        return self.decode_token_s + (k - 1) * self.batch_extra_s

    def token_share_s(self, k: int, scale: float = 1.0) -> float:
        """One call's share of a batched step of ``k`` calls (× ``scale``, its length stand-in)."""
        return self.decode_step_s(k) / k * scale


class DeviceClock:
    """One cell's device timeline (``time.monotonic`` seconds); thread-safe.

    ``charged_s`` sums every reservation; ``waited_s`` the time charges waited beyond their real
    computation (what the clock added).
    """

    def __init__(self, now: Callable[[], float] = time.monotonic) -> None:
        self._now = now
        self._lock = threading.Lock()
        self.busy_until = 0.0
        self.charged_s = 0.0
        self.waited_s = 0.0
        self.charges = 0

    def reserve(self, seconds: float, started_at: float) -> float:
        """Reserve ``seconds`` for work that started at ``started_at``; returns when it ends on the
        device: ``max(started_at, busy_until) + seconds``. Zero seconds reserves nothing and ends at
        ``started_at`` (a no-op, even while the device is busy)."""
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"device seconds must be finite and ≥ 0, got {seconds}")
        if seconds == 0:
            return started_at
        with self._lock:
            end = max(started_at, self.busy_until) + seconds
            self.busy_until = end
            self.charged_s += seconds
            self.charges += 1
            return end

    def charge(self, seconds: float, started_at: float | None = None, *,
               abort: threading.Event | None = None) -> float:
        """Reserve ``seconds`` (for work started at ``started_at``, default now) and wait until the
        reservation ends (or ``abort`` is set: the reservation stays, the device did the work); returns
        the reservation's end."""
        end = self.reserve(seconds, self._now() if started_at is None else started_at)
        left = end - self._now()
        if left > 0:
            t0 = self._now()
            if abort is not None:
                abort.wait(left)
            else:
                time.sleep(left)
            with self._lock:
                self.waited_s += self._now() - t0
        return end

    def stats(self) -> dict[str, float]:
        with self._lock:
            return {"device_charged_s": self.charged_s, "device_waited_s": self.waited_s,
                    "device_charges": float(self.charges)}
