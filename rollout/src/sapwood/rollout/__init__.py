"""sapwood.rollout: what rollout workers run — the TITO recorder and its transports (the recorder SDK).

The SDK (``recorder``, ``transports``, ``engines``) needs only the base install: no torch, no
learner. ``torch_engine`` (``LocalTorchEngine`` on the learner's tiny model, extra ``rollout``) is
not imported here.
"""

from sapwood.rollout.recorder import ExecutionRecorder, NodeRef, Recorder
from sapwood.rollout.transports import (
    BackpressureTimeout,
    DeliveryError,
    EventTooLargeError,
    InProcessTransport,
    KafkaTransport,
    MemoryTransport,
    Transport,
    TransportError,
    make_transport,
)

__all__ = [
    "BackpressureTimeout",
    "DeliveryError",
    "EventTooLargeError",
    "ExecutionRecorder",
    "InProcessTransport",
    "KafkaTransport",
    "MemoryTransport",
    "NodeRef",
    "Recorder",
    "Transport",
    "TransportError",
    "make_transport",
]
