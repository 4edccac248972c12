"""The demo's background threads: the learner's step loop and (Kafka mode) the ingest service."""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from sapwood.demo.config import DemoConfig
from sapwood.learner.loop import Learner

__all__ = ["IngestThread", "LearnerThread", "quiet_kafka"]


class LearnerThread(threading.Thread):
    """The learner's step loop in a daemon thread; an exception ends it and is kept in ``error``."""

    def __init__(self, learner: Learner, on_step: Callable[[dict[str, float]], None]) -> None:
        super().__init__(name="learner", daemon=True)
        self.learner = learner
        self.on_step = on_step
        self.error: BaseException | None = None
        self._stop_event = threading.Event()

    def stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        try:
            while not self._stop_event.is_set():
                metrics = self.learner.step(timeout_s=0.25)
                if metrics is not None:
                    metrics["learner/time"] = time.time()
                    self.on_step(metrics)
        except BaseException as exc:  # surfaced by the demo's main loop
            self.error = exc


class IngestThread:
    """The Kafka → store ingest service in a thread (Kafka mode only)."""

    def __init__(self, cfg: DemoConfig, database_url: str, topic: str, group: str) -> None:
        from sapwood.ingest.service import IngestConfig, IngestService

        assert cfg.kafka_bootstrap
        self.service = IngestService(IngestConfig(
            database_url=database_url, bootstrap=cfg.kafka_bootstrap, topic=topic, group=group,
            dead_letter_topic=None, partitions=4, lag_interval_s=0.5, poll_timeout_ms=100,
        ))
        self.thread = threading.Thread(target=self._run, name="ingest", daemon=True)
        self.error: BaseException | None = None

    def _run(self) -> None:
        try:
            self.service.run()
        except BaseException as exc:
            self.error = exc

    def start(self) -> None:
        self.thread.start()

    @property
    def lag(self) -> int:
        return int(sum(self.service.lag.values()))

    def stop(self) -> None:
        self.service.stop()
        self.thread.join(timeout=30)


@contextmanager
def quiet_kafka() -> Iterator[None]:
    """Silence kafka-python's DeprecationWarnings while topics, consumers and producers are set up."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        yield
