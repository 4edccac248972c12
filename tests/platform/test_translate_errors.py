"""The store boundary's error classification: which driver errors mean "the database is unavailable"."""

from __future__ import annotations

import psycopg
import pytest
import sqlalchemy.exc as sa_exc

from sapwood.platform.errors import ConflictError, StoreError, StoreUnavailableError
from sapwood.platform.storage.errors import translate_errors


@pytest.mark.parametrize(
    ("raised", "expected"),
    [
        (psycopg.OperationalError("server closed the connection unexpectedly"), StoreUnavailableError),
        (psycopg.InterfaceError("the connection is closed"), StoreUnavailableError),
        (sa_exc.DisconnectionError("pre-ping failed"), StoreUnavailableError),
        (sa_exc.OperationalError("SELECT 1", {}, Exception("terminating connection")), StoreUnavailableError),
        (sa_exc.IntegrityError("INSERT", {}, Exception("duplicate key")), ConflictError),
        (psycopg.IntegrityError("duplicate key in COPY"), ConflictError),
        (psycopg.DataError("invalid input syntax"), StoreError),
        (sa_exc.ProgrammingError("SELECT", {}, Exception("syntax error")), StoreError),
        (sa_exc.NoSuchTableError("nodes"), StoreError),
    ],
)
def test_each_driver_error_becomes_its_store_error(raised: Exception, expected: type[Exception]) -> None:
    with pytest.raises(expected) as info, translate_errors():
        raise raised
    assert type(info.value) is expected, f"{type(raised).__name__} became {type(info.value).__name__}"
    assert info.value.__cause__ is raised


def test_store_errors_pass_through_unchanged() -> None:
    err = ConflictError("already there")
    with pytest.raises(ConflictError) as info, translate_errors():
        raise err
    assert info.value is err
