"""The dead-letter classifier: is a failed batch or record worth retrying, or is it dead-lettered?

It asks the platform, never the driver: every error (and every error it was raised from) is first put
through :func:`sapwood.platform.storage.errors.translate_errors`, the one place that maps SQLAlchemy and psycopg
errors onto :mod:`sapwood.platform.errors`. Then:

- a :class:`~sapwood.platform.errors.StoreUnavailableError` anywhere in the chain → :attr:`Verdict.RECONNECT`
  (transient: roll back, drop pooled connections, re-seek every partition to its stored offset, back off);
- a batch failing for another reason → :attr:`Verdict.RETRY` (a write race or one bad record: the batch is
  retried one record per transaction);
- a record failing alone → :attr:`Verdict.RETRY` up to ``attempts`` times, except a
  :class:`~sapwood.platform.errors.ValidationError` (bad input: retrying will not help) → :attr:`Verdict.DEAD_LETTER`
  at once; the dead letter's reason is ``store_error`` for Sapwood's own errors, ``internal_error`` otherwise.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator

from sapwood.platform.errors import SapwoodError, StoreUnavailableError, ValidationError
from sapwood.platform.storage.errors import translate_errors


class Verdict(enum.Enum):
    RECONNECT = "reconnect"
    """Transient: the database connection is gone."""
    RETRY = "retry"
    """Transient: try again (a batch: record by record)."""
    DEAD_LETTER = "dead_letter"
    """Permanent: the record will not apply; dead-letter it."""


def platform_error(exc: BaseException) -> BaseException:
    """``exc`` as the platform classifies it: the Sapwood error :func:`translate_errors` turns a driver
    error into, else ``exc`` itself (Sapwood's own errors and errors that are not the database's)."""
    if isinstance(exc, SapwoodError):
        return exc
    boundary, traceback = translate_errors(), exc.__traceback__
    boundary.__enter__()
    try:
        boundary.__exit__(type(exc), exc, traceback)  # re-raises a translation; False: not a driver error
    except SapwoodError as translated:
        return translated
    finally:
        exc.__traceback__ = traceback  # throwing it into the boundary added a frame
    return exc


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and the errors it was raised from or during (``__cause__``, ``__context__``), each once."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        yield cur
        cur = cur.__cause__ or cur.__context__


def connection_lost(exc: BaseException) -> bool:
    """Whether ``exc`` (or an error it was raised from) means the database connection is gone."""
    return any(isinstance(platform_error(e), StoreUnavailableError) for e in _chain(exc))


class DeadLetterClassifier:
    """Verdicts on failed transactions; ``attempts``: most tries of one record before it is dead-lettered."""

    def __init__(self, *, attempts: int = 2) -> None:
        if attempts < 1:
            raise ValueError(f"attempts must be ≥ 1, got {attempts}")
        self.attempts = attempts

    def batch_failed(self, exc: BaseException) -> Verdict:
        """A transaction of several records failed with ``exc``."""
        return Verdict.RECONNECT if connection_lost(exc) else Verdict.RETRY

    def record_failed(self, exc: BaseException, attempt: int) -> Verdict:
        """A record alone in its transaction failed with ``exc`` on try number ``attempt`` (1-based)."""
        if connection_lost(exc):
            return Verdict.RECONNECT
        if isinstance(platform_error(exc), ValidationError) or attempt >= self.attempts:
            return Verdict.DEAD_LETTER
        return Verdict.RETRY

    @staticmethod
    def reason(exc: BaseException) -> str:
        """The dead-letter reason of a record that failed alone with ``exc``."""
        return "store_error" if isinstance(platform_error(exc), SapwoodError) else "internal_error"


__all__ = ["DeadLetterClassifier", "Verdict", "connection_lost", "platform_error"]
