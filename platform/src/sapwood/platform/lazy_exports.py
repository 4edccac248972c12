"""Lazy re-exports of a component package: its public names are imported on first use, not on import.

A package ``__init__`` re-exporting names of heavy submodules (torch, FastAPI) made every ``sapwood`` command
pay for them: the CLI imports each component's ``cli`` module, which imports its package first. With

    if TYPE_CHECKING:
        from sapwood.learner.trainer import SAOTrainer
    __all__ = ["SAOTrainer", ...]
    __getattr__ = lazy_exports(__name__, __all__, ("trainer", ...), needs=("torch",))

the type checker sees the names, ``import sapwood.learner.cli`` stays light, and ``sapwood.learner.SAOTrainer``
imports the submodules on first use. ``needs`` keeps the package's import failing (``ModuleNotFoundError``
naming the package) where that extra is not installed, checked without importing it, so the CLI still
registers stubs naming the extra.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(package: str, names: Sequence[str], submodules: Sequence[str], *,
                 needs: Sequence[str] = ()) -> Callable[[str], Any]:
    """The module ``__getattr__`` of ``package``: a name of ``names`` is taken from the first of ``submodules``
    (relative to ``package``) that defines it, and kept in the package; any other name raises AttributeError
    (so ``from package import submodule`` still imports the submodule). Raises ModuleNotFoundError now when a
    distribution of ``needs`` is not installed."""
    for dist in needs:
        if importlib.util.find_spec(dist) is None:
            raise ModuleNotFoundError(f"No module named {dist!r}", name=dist)
    exported = frozenset(names)

    def __getattr__(name: str) -> Any:
        if name not in exported:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        for sub in submodules:
            module = importlib.import_module(f"{package}.{sub}")
            if hasattr(module, name):
                value = getattr(module, name)
                setattr(sys.modules[package], name, value)
                return value
        raise AttributeError(f"module {package!r} exports {name!r} but none of {list(submodules)} defines it")

    return __getattr__
