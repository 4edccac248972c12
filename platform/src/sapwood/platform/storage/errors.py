"""The store boundary: driver errors (SQLAlchemy's, and the raw driver's) as Sapwood's exception types."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from sqlalchemy import exc as sa_exc

from sapwood.platform.errors import ConflictError, SapwoodError, StoreError, StoreUnavailableError
from sapwood.platform.storage.postgres.errors import driver_error, is_driver_error, is_integrity_error


@contextlib.contextmanager
def translate_errors() -> Iterator[None]:
    """Translate driver errors into Sapwood's exception types at the boundary."""
    try:
        yield
    except SapwoodError:
        raise
    except sa_exc.IntegrityError as exc:
        raise ConflictError(f"store constraint violated: {exc.orig}") from exc
    except sa_exc.DBAPIError as exc:
        if exc.connection_invalidated or isinstance(exc, sa_exc.OperationalError | sa_exc.InterfaceError):
            raise StoreUnavailableError(f"database unavailable: {exc.orig}") from exc
        raise StoreError(f"database error: {exc.orig}") from exc
    except sa_exc.DisconnectionError as exc:  # a pool's pre-ping or checkout found the connection gone
        raise StoreUnavailableError(f"database unavailable: {exc}") from exc
    except sa_exc.TimeoutError as exc:  # the pool had no connection free within its timeout
        raise StoreUnavailableError(f"no database connection free (pool exhausted): {exc}") from exc
    except sa_exc.SQLAlchemyError as exc:
        raise StoreError(f"database error: {exc}") from exc
    except Exception as exc:
        translated = driver_error(exc)
        if translated is None:
            raise
        raise translated from exc


def lost_write_race(exc: ConflictError) -> bool:
    """Whether ``exc`` came from a constraint violation (a concurrent writer stored the same row first)."""
    return isinstance(exc.__cause__, sa_exc.IntegrityError) or is_integrity_error(exc.__cause__)


def from_driver(exc: BaseException) -> bool:
    """Whether ``exc`` was translated from a database driver's error (its text is not for clients)."""
    cause = exc.__cause__
    return isinstance(cause, sa_exc.SQLAlchemyError) or is_driver_error(cause)
