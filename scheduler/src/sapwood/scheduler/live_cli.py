"""``sapwood scheduler run`` (filled in with the live loop)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    return None
