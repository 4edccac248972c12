"""No component imports itself in a circle: every module-level import graph inside a component is acyclic.

Imports under ``TYPE_CHECKING`` and inside functions count too (a cycle only hidden from the
interpreter is still one for a reader following the calls). The layers contracts in ``pyproject.toml``
fix the direction between a component's packages; this test finds a cycle anywhere, naming its modules.
"""

from __future__ import annotations

from pathlib import Path

import grimp
import pytest

COMPONENTS = ["platform", "ingest", "rollout", "gateway", "learner", "scheduler", "api", "demo", "adapters"]


def cycles(package: str) -> list[list[str]]:
    """The strongly connected components (> 1 module) of ``package``'s import graph, each sorted."""
    graph = grimp.build_graph(package)
    edges = {m: sorted(i for i in graph.find_modules_directly_imported_by(m) if i.startswith(package + "."))
             for m in graph.modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(root: str) -> None:  # Tarjan's algorithm, iterative (no recursion limit)
        work = [(root, iter(edges.get(root, ())))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(edges.get(child, ()))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                members = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    members.append(member)
                    if member == node:
                        break
                if len(members) > 1:
                    found.append(sorted(members))

    for module in sorted(edges):
        if module not in index:
            visit(module)
    return found


@pytest.mark.parametrize("component", COMPONENTS)
def test_no_import_cycle_inside_the_component(component: str) -> None:
    assert cycles(f"sapwood.{component}") == []


def test_a_cycle_is_found_and_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "cyclepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from cyclepkg import b\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from cyclepkg import a\n")
    (pkg / "c.py").write_text("from cyclepkg import a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert cycles("cyclepkg") == [["cyclepkg.a", "cyclepkg.b"]]
