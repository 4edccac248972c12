"""A Kafka broker of a test's own, which the test may stop and start (the shared broker stays up).

``scripts/services.py`` formats and launches it (same jars, same config as the shared test broker),
in a folder of the test's; :class:`PrivateBroker` stops it with SIGTERM and launches it again on the
same ports and log dir, so clients that knew it reconnect to the same address::

    with private_broker(tmp_path / "kafka") as broker:
        broker.stop()    # the broker is down: connections are refused
        broker.start()   # back, with every acknowledged record
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.services import services_module


@dataclass
class PrivateBroker:
    """One KRaft broker+controller on loopback; ``state`` is what ``scripts/services.py`` recorded."""

    state: dict[str, Any]

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.state['port']}"

    def stop(self) -> None:
        """SIGTERM the broker and wait until it exited."""
        services_module().stop_kafka_process(self.state)

    def start(self) -> None:
        """Launch it again on the same ports and log dir; returns once an admin client is answered."""
        services_module().launch_kafka(self.state)


@contextlib.contextmanager
def private_broker(folder: Path) -> Iterator[PrivateBroker]:
    """Start a fresh broker in ``folder`` (skips when the broker jars are not installed); stop it on exit."""
    mod = services_module()
    if not (mod.kafka_libs_dir() / ".complete").exists():
        pytest.skip("no server: Kafka broker jars are not installed (python scripts/services.py install)")
    broker = PrivateBroker(mod.start_kafka(folder))
    try:
        yield broker
    finally:
        broker.stop()
        shutil.rmtree(folder, ignore_errors=True)


__all__ = ["PrivateBroker", "private_broker"]
