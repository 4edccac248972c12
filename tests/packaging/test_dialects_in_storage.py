"""Dialect-specific code lives under ``platform/src/sapwood/platform/storage/`` and nowhere else.

Outside it, no module imports a driver or SQLAlchemy's dialect packages, names a backend in an
identifier, or branches on a backend's name in a string. Docstrings, comments and the text shown to
users (CLI help, setting descriptions, default URLs) may name a backend.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STORAGE = ROOT / "platform" / "src" / "sapwood" / "platform" / "storage"
DIALECT = re.compile(r"postgres|sqlite|psycopg", re.IGNORECASE)
DRIVER_MODULES = ("psycopg", "sqlite3", "sqlalchemy.dialects")
#: Keywords whose string values are text for users or a default URL, not code.
USER_TEXT_KEYWORDS = {"help", "description", "default", "default_factory"}

#: Modules that still hold dialect-specific code, each with why it stays (kept short on purpose).
KNOWN = {
    # The tables' column types: one metadata for both backends (``with_variant``), used by the migrations.
    "platform/src/sapwood/platform/schema.py",
}


def _sources() -> list[Path]:
    return sorted(p for p in ROOT.glob("*/src/sapwood/**/*.py") if STORAGE not in p.parents)


def _docstrings(tree: ast.AST) -> set[int]:
    ids: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def _user_text(tree: ast.AST) -> set[int]:
    ids: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg in USER_TEXT_KEYWORDS:
            ids.update(id(n) for n in ast.walk(node.value))
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):  # attribute docstrings
            ids.add(id(node.value))
    return ids


def dialect_code(source: str) -> list[str]:
    """What in ``source`` is dialect-specific code: driver imports, identifiers and strings naming a backend."""
    tree = ast.parse(source)
    skip = _docstrings(tree) | _user_text(tree)
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            found += [f"line {node.lineno}: imports {n}" for n in names if n.startswith(DRIVER_MODULES)]
        elif isinstance(node, ast.Name | ast.Attribute | ast.FunctionDef | ast.ClassDef | ast.arg):
            name = getattr(node, "id", None) or getattr(node, "attr", None) or getattr(node, "name", None) \
                or getattr(node, "arg", "")
            if DIALECT.search(name):
                found.append(f"line {node.lineno}: name {name}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip \
                and DIALECT.search(node.value):
            found.append(f"line {node.lineno}: string {node.value[:60]!r}")
    return found


def test_the_check_sees_dialect_code() -> None:
    assert dialect_code("import psycopg\n") == ["line 1: imports psycopg"]
    assert dialect_code("from sqlalchemy.dialects import postgresql\n") == ["line 1: imports sqlalchemy.dialects"]
    assert dialect_code("def f(url):\n    return url.startswith('sqlite')\n") == ["line 2: string 'sqlite'"]
    assert dialect_code("x = pg.postgres_engine\n") == ["line 1: name postgres_engine"]


def test_the_check_lets_user_text_through() -> None:
    text = '"""On PostgreSQL..."""\nimport typer\n# SQLite\nOpt = typer.Option(help="PostgreSQL name")\n'
    assert dialect_code(text) == []


def test_no_dialect_code_outside_storage() -> None:
    offenders = {}
    for path in _sources():
        rel = path.relative_to(ROOT).as_posix()
        found = dialect_code(path.read_text(encoding="utf-8"))
        if found and rel not in KNOWN:
            offenders[rel] = found
    assert offenders == {}, "dialect-specific code outside platform/storage/ (move it under storage/sqlite or postgres)"


def test_known_exceptions_still_exist_and_still_need_it() -> None:
    stale = [rel for rel in sorted(KNOWN) if not (ROOT / rel).exists()
             or not dialect_code((ROOT / rel).read_text(encoding="utf-8"))]
    assert stale == [], "remove these from KNOWN: they hold no dialect code any more"
