"""The one place a dialect name is read: factories by name, the embedded store's URL, a URL's backend."""

from __future__ import annotations

from pathlib import Path

import pytest

from sapwood.platform.storage.dialects import backend_of, embedded_url, for_dialect
from sapwood.platform.store import Store


def test_for_dialect_picks_by_name_and_refuses_another_backend_naming_what() -> None:
    pick = {"sqlite": lambda: "s", "postgresql": lambda: "p"}
    assert for_dialect("sqlite", "thing", **pick) == "s"
    assert for_dialect("postgresql", "thing", **pick) == "p"
    with pytest.raises(ValueError, match="no thing for dialect 'mysql'"):
        for_dialect("mysql", "thing", **pick)


def test_embedded_url_opens_a_store_file_at_that_path(tmp_path: Path) -> None:
    path = tmp_path / "dir with space" / "s.db"
    path.parent.mkdir()
    store = Store.open(embedded_url(path))
    try:
        assert path.exists()
        assert backend_of(embedded_url(path)) == store.engine.dialect.name
    finally:
        store.close()


@pytest.mark.parametrize(("url", "backend"), [
    ("sqlite:///x.db", "sqlite"),
    ("postgresql+psycopg://u@h:5432/db", "postgresql"),
    ("postgresql://u@h/db", "postgresql"),
])
def test_backend_of_drops_the_driver(url: str, backend: str) -> None:
    assert backend_of(url) == backend
