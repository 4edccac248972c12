"""The tests' own style: an assert checks one thing, so a failure names the part that failed and its values.

``assert a and b`` reports only that the whole ``and`` was false; ``assert a`` then ``assert b`` reports which
one and pytest shows the operands. ``assert not (a and b)``, ``assert a and b or c`` and ``and`` inside a
call (``all(a and b for ...)``) are other checks and are allowed.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def compound_asserts(source: str, filename: str) -> list[str]:
    """``filename:line`` of every assert whose whole test is an ``and`` chain."""
    return [
        f"{filename}:{node.lineno}"
        for node in ast.walk(ast.parse(source, filename))
        if isinstance(node, ast.Assert) and isinstance(node.test, ast.BoolOp) and isinstance(node.test.op, ast.And)
    ]


def test_no_test_asserts_an_and_chain() -> None:
    found = [
        hit
        for path in sorted(TESTS.rglob("*.py"))
        for hit in compound_asserts(path.read_text(), str(path.relative_to(TESTS.parent)))
    ]
    assert found == [], "split these into one assert per part (same message on each):\n" + "\n".join(found)


def test_the_check_names_each_compound_assert_and_allows_the_other_forms() -> None:
    source = (
        "def test_x(a, b, c):\n"
        "    assert a and b\n"
        "    assert (a and\n"
        "            b), 'message'\n"
        "    assert not (a and b)\n"
        "    assert a and b or c\n"
        "    assert all(a and b for _ in c)\n"
        "    assert a\n"
    )
    assert compound_asserts(source, "tests/x/test_x.py") == ["tests/x/test_x.py:2", "tests/x/test_x.py:3"]
