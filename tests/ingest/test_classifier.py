"""The dead-letter classifier: each kind of failure → its verdict (no servers)."""

from __future__ import annotations

import psycopg
import pytest
from sqlalchemy import exc as sa_exc

from sapwood.ingest.classifier import DeadLetterClassifier, Verdict, connection_lost, platform_error
from sapwood.platform.errors import (
    ConflictError,
    DecodeError,
    SequenceError,
    StoreError,
    StoreUnavailableError,
    UnknownParentError,
)


def _sa(cls: type[sa_exc.DBAPIError], orig: BaseException, **kw: bool) -> sa_exc.DBAPIError:
    return cls("INSERT INTO events ...", {}, orig, **kw)  # type: ignore[arg-type]


def _raised_from(outer: BaseException, inner: BaseException) -> BaseException:
    try:
        try:
            raise inner
        except BaseException as exc:
            raise outer from exc
    except BaseException as caught:
        return caught


LOST = [
    StoreUnavailableError("database unavailable"),
    _sa(sa_exc.OperationalError, psycopg.OperationalError("server closed the connection unexpectedly")),
    _sa(sa_exc.InterfaceError, psycopg.InterfaceError("the connection is closed")),
    _sa(sa_exc.DBAPIError, RuntimeError("socket gone"), connection_invalidated=True),
    psycopg.OperationalError("terminating connection due to administrator command"),  # raw COPY path
    _raised_from(KeyError("x"), psycopg.OperationalError("consuming input failed")),
    _raised_from(StoreError("database error"), StoreUnavailableError("database unavailable")),
]


@pytest.mark.parametrize("exc", LOST, ids=lambda e: type(e).__name__)
def test_a_lost_connection_means_reconnect_for_a_batch_and_a_record(exc: BaseException) -> None:
    c = DeadLetterClassifier()
    assert connection_lost(exc)
    assert c.batch_failed(exc) is Verdict.RECONNECT
    assert c.record_failed(exc, 1) is Verdict.RECONNECT
    assert c.record_failed(exc, 99) is Verdict.RECONNECT, "never dead-letter a record for a lost connection"


TRANSIENT_THEN_DEAD = [  # (error, reason once it still fails on the last try)
    (ConflictError("store constraint violated"), "store_error"),
    (_sa(sa_exc.IntegrityError, psycopg.IntegrityError("duplicate key value")), "store_error"),
    (StoreError("value too long for type character varying(128)"), "store_error"),
    (_sa(sa_exc.DataError, psycopg.DataError("numeric field overflow")), "store_error"),
    (psycopg.ProgrammingError("syntax error"), "store_error"),
    (ValueError("bug"), "internal_error"),
    (KeyError("missing"), "internal_error"),
]


@pytest.mark.parametrize(("exc", "reason"), TRANSIENT_THEN_DEAD, ids=lambda e: type(e).__name__)
def test_other_failures_are_retried_then_dead_lettered(exc: BaseException, reason: str) -> None:
    c = DeadLetterClassifier(attempts=2)
    assert not connection_lost(exc)
    assert c.batch_failed(exc) is Verdict.RETRY, "a failed batch is retried record by record"
    assert c.record_failed(exc, 1) is Verdict.RETRY
    assert c.record_failed(exc, 2) is Verdict.DEAD_LETTER
    assert c.reason(exc) == reason


@pytest.mark.parametrize("exc", [UnknownParentError("no node n"), SequenceError("gap"), DecodeError("bytes")],
                         ids=lambda e: type(e).__name__)
def test_bad_input_is_dead_lettered_without_a_second_try(exc: BaseException) -> None:
    c = DeadLetterClassifier(attempts=5)
    assert c.batch_failed(exc) is Verdict.RETRY, "in a batch, the bad record may be another one"
    assert c.record_failed(exc, 1) is Verdict.DEAD_LETTER
    assert c.reason(exc) == "store_error"


def test_the_number_of_tries_is_configurable_and_at_least_one() -> None:
    c = DeadLetterClassifier(attempts=1)
    assert c.record_failed(ConflictError("race"), 1) is Verdict.DEAD_LETTER
    c = DeadLetterClassifier(attempts=3)
    assert [c.record_failed(ConflictError("race"), n) for n in (1, 2, 3)] == [Verdict.RETRY, Verdict.RETRY,
                                                                                 Verdict.DEAD_LETTER]
    with pytest.raises(ValueError, match="attempts must be ≥ 1, got 0"):
        DeadLetterClassifier(attempts=0)


def test_platform_error_is_translate_errors_and_leaves_the_error_as_it_was() -> None:
    driver = _sa(sa_exc.IntegrityError, psycopg.IntegrityError("duplicate key"))
    translated = platform_error(driver)
    assert type(translated) is ConflictError
    assert translated.__cause__ is driver
    assert driver.__traceback__ is None, "the driver error is not altered"
    assert driver.__context__ is None, "the driver error is not altered"
    mine = StoreError("x")
    assert platform_error(mine) is mine
    other = ValueError("y")
    assert platform_error(other) is other
