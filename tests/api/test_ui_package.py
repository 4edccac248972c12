"""The viewer's static assets ship in the wheel and load nothing from another origin."""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

from hatchling.builders.wheel import WheelBuilder

from sapwood.api.ui import STATIC_DIR

ROOT = Path(__file__).resolve().parents[2]


def test_every_static_asset_is_in_the_wheel(tmp_path: Path) -> None:
    (wheel,) = WheelBuilder(str(ROOT)).build(directory=str(tmp_path), versions=["standard"])
    names = set(zipfile.ZipFile(wheel).namelist())
    assets = sorted(p.relative_to(STATIC_DIR).as_posix() for p in STATIC_DIR.rglob("*") if p.is_file())
    assert {"index.html", "app.js", "style.css", "blake2b.js"} <= set(assets)
    missing = [a for a in assets if f"sapwood/api/ui/static/{a}" not in names]
    assert missing == []


def test_assets_reference_no_other_origin() -> None:
    for path in STATIC_DIR.rglob("*"):
        if path.suffix in (".html", ".js", ".css"):
            text = path.read_text()
            assert not re.search(r"(?:src|href)\s*=\s*[\"']?(?:https?:)?//", text), path.name
            assert "@import" not in text, path.name
            assert "innerHTML" not in text, path.name
            assert "eval(" not in text, path.name
