"""Dead letters: records ingest could not apply, kept with the reason and the original bytes.

The ``dead_letters`` table (:mod:`sapwood.platform.storage.deadletters`) is written in the same transaction
as the batch (exactly once, authoritative). The dead-letter topic gets a copy after the commit, best effort:
a crash between the commit and the send loses the topic copy, never the table row.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass

from sqlalchemy.engine import Connection

from sapwood.platform.storage.deadletters import insert_dead_letters, key_text

log = logging.getLogger(__name__)

#: The copy on the dead-letter topic carries at most this many bytes of the original record.
TOPIC_PAYLOAD_LIMIT = 512 * 1024


@dataclass
class DeadLetter:
    """One record that could not be applied."""

    reason: str
    message: str
    payload: bytes
    source: str
    key: bytes | None = None
    event_id: str | None = None
    execution_id: str | None = None


def log_dead_letters(letters: list[DeadLetter]) -> None:
    """One structured WARNING line per dead letter: reason, where (topic/partition@offset), key, event id.

    The fields also travel as ``extra={"dead_letter": {...}}`` for JSON log formatters."""
    for dl in letters:
        key = key_text(dl.key) if dl.key is not None else None
        fields = {"reason": dl.reason, "source": dl.source, "key": key if key is not None or dl.key is None
                  else dl.key.hex(), "event_id": dl.event_id, "bytes": len(dl.payload)}
        log.warning("dead_letter reason=%s source=%s key=%s event_id=%s bytes=%d message=%r", fields["reason"],
                    fields["source"], fields["key"], fields["event_id"] or "-", fields["bytes"], dl.message[:300],
                    extra={"dead_letter": fields})


def write_dead_letters(conn: Connection, letters: list[DeadLetter]) -> None:
    """Insert ``letters`` into ``dead_letters`` in the caller's transaction."""
    insert_dead_letters(conn, letters)


class DeadLetterPublisher:
    """Best-effort copy of dead letters to a Kafka topic (headers: reason, message, source)."""

    def __init__(self, bootstrap: str, topic: str, *, client_id: str = "sapwood-ingest-dlq") -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            from kafka import KafkaProducer

        self.topic = topic
        self.failures = 0
        self._producer = KafkaProducer(
            bootstrap_servers=bootstrap, client_id=client_id, acks="all", enable_idempotence=True,
            linger_ms=5, max_block_ms=5000, max_request_size=TOPIC_PAYLOAD_LIMIT + 64 * 1024,
            reconnect_backoff_max_ms=1000,
        )

    def publish(self, letters: list[DeadLetter]) -> None:
        for dl in letters:
            headers = [
                ("reason", dl.reason.encode()),
                ("message", dl.message[:1000].encode()),
                ("source", dl.source.encode()),
                ("original-size", str(len(dl.payload)).encode()),
            ]
            if dl.event_id:
                headers.append(("event-id", str(dl.event_id).encode()))
            try:
                future = self._producer.send(self.topic, key=dl.key, value=dl.payload[:TOPIC_PAYLOAD_LIMIT],
                                             headers=headers)
                future.add_errback(self._failed)
            except Exception as exc:
                self._failed(exc)

    def _failed(self, exc: BaseException) -> None:
        self.failures += 1
        log.warning("dead letter not copied to topic %s: %s", self.topic, exc)

    def close(self, timeout: float = 10.0) -> None:
        try:
            self._producer.flush(timeout=timeout)
        except Exception as exc:
            log.warning("dead-letter topic flush failed: %s", exc)
        self._producer.close(timeout=timeout)


__all__ = ["DeadLetter", "DeadLetterPublisher", "log_dead_letters", "write_dead_letters"]
