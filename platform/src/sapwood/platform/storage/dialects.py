"""Which implementation of a storage interface serves a backend: the one place a dialect name is read."""

from __future__ import annotations

from collections.abc import Callable
from os import PathLike
from pathlib import Path
from typing import TypeVar

from sqlalchemy.engine import Connection, Engine, make_url

T = TypeVar("T")


def dialect_name(dialect: str | Engine | Connection) -> str:
    """``"sqlite"`` / ``"postgresql"`` of a dialect name, an engine or a connection."""
    return dialect if isinstance(dialect, str) else dialect.dialect.name


def for_dialect(dialect: str | Engine | Connection, what: str, *, sqlite: Callable[[], T],
                postgresql: Callable[[], T]) -> T:
    """``sqlite()`` or ``postgresql()`` as ``dialect`` is; :class:`ValueError` naming ``what`` for another backend."""
    name = dialect_name(dialect)
    if name == "postgresql":
        return postgresql()
    if name == "sqlite":
        return sqlite()
    raise ValueError(f"no {what} for dialect {name!r}; expected 'sqlite' or 'postgresql'")


def embedded_url(path: str | PathLike[str]) -> str:
    """The database URL of the embedded store file at ``path`` (created on first open)."""
    return f"sqlite:///{Path(path)}"


def backend_of(url: str) -> str:
    """The backend a database URL names (``"sqlite"``, ``"postgresql"``, …), without its driver."""
    return make_url(url).get_backend_name()
