"""sapwood.rollout: what rollout workers run — the TITO recorder and its transports."""

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
