"""psycopg errors raised outside SQLAlchemy (a COPY on the raw driver connection) as Sapwood errors."""

from __future__ import annotations

import psycopg

from sapwood.platform.errors import ConflictError, SapwoodError, StoreError, StoreUnavailableError


def driver_error(exc: BaseException) -> SapwoodError | None:
    """The Sapwood error ``exc`` stands for when it is a psycopg error; ``None`` for any other exception."""
    if isinstance(exc, psycopg.IntegrityError):
        return ConflictError(f"store constraint violated: {exc}")
    if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):  # InterfaceError: a closed connection
        return StoreUnavailableError(f"database unavailable: {exc}")
    if isinstance(exc, psycopg.Error):
        return StoreError(f"database error: {exc}")
    return None


def is_integrity_error(exc: BaseException | None) -> bool:
    """Whether ``exc`` is psycopg's constraint violation (a COPY's duplicate key)."""
    return isinstance(exc, psycopg.IntegrityError)


def is_driver_error(exc: BaseException | None) -> bool:
    """Whether ``exc`` is an error psycopg raised."""
    return isinstance(exc, psycopg.Error)
