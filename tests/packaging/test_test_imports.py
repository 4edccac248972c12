"""The tests share code one way: ``from tests.support.<module> import ...``.

No test module imports another test module, and ``tests/`` itself is not on ``sys.path`` (the repository
root is, through pytest's ``pythonpath``), so ``tests/api``, ``tests/ingest``, ... never answer for a
top-level name such as ``api`` or ``ingest``.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
TEST_FOLDERS = sorted(p.name for p in TESTS.iterdir() if p.is_dir() and not p.name.startswith(("_", ".")))


def imports_of_test_code(source: str, filename: str) -> list[str]:
    """``filename:line: module`` of every import of test code other than ``tests.support``."""
    bad = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.ImportFrom):
            names = ["." * node.level + (node.module or "")]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            if top in sys.stdlib_module_names:  # `import platform` is the standard library's
                continue
            if (name.startswith(".") or top in TEST_FOLDERS
                    or (top == "tests" and name != "tests.support" and not name.startswith("tests.support."))):
                bad.append(f"{filename}:{node.lineno}: {name}")
    return bad




def test_test_code_is_imported_only_from_tests_support() -> None:
    bad = [
        hit
        for path in sorted(TESTS.rglob("*.py"))
        for hit in imports_of_test_code(path.read_text(), str(path.relative_to(TESTS.parent)))
    ]
    assert bad == [], "import shared test code as `from tests.support.<module> import ...`:\n" + "\n".join(bad)


def test_the_check_names_the_other_styles() -> None:
    source = (
        "from tests.support.histories import small_execution\n"
        "import tests.support.services\n"
        "from support.histories import small_execution\n"
        "from api.api_helpers import make_client\n"
        "from tests.api.test_api_audit import x\n"
        "from . import y\n"
        "import ingest.spec_producer\n"
    )
    assert imports_of_test_code(source, "t.py") == [
        "t.py:3: support.histories",
        "t.py:4: api.api_helpers",
        "t.py:5: tests.api.test_api_audit",
        "t.py:6: .",
        "t.py:7: ingest.spec_producer",
    ]


def test_the_tests_folder_is_not_on_sys_path() -> None:
    on_path = [p for p in sys.path if p and Path(p).resolve() == TESTS]
    assert on_path == [], f"{TESTS} is on sys.path (from PYTHONPATH?): tests/<folder> would shadow top-level names"


def test_no_test_folder_answers_for_a_top_level_name() -> None:
    assert "api" in TEST_FOLDERS
    assert "ingest" in TEST_FOLDERS
    shadowed = {}
    for name in TEST_FOLDERS:
        spec = importlib.util.find_spec(name)
        places = [] if spec is None else [*(spec.submodule_search_locations or []), spec.origin or ""]
        inside = [p for p in places if p and Path(p).resolve().is_relative_to(TESTS)]
        if inside:
            shadowed[name] = inside
    assert shadowed == {}, f"these names import from the tests folder: {shadowed}"
