"""sapwood.api: the REST API over trajectory trees — queries, exact-context audit, replay runs, Parquet export."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sapwood.platform.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from sapwood.api.config import ApiSettings
    from sapwood.api.main import create_app
    from sapwood.api.tokenizer import CharTokenizer, Tokenizer

__all__ = ["ApiSettings", "CharTokenizer", "Tokenizer", "create_app"]

__getattr__ = lazy_exports(__name__, __all__, ("config", "main", "tokenizer"), needs=("fastapi", "pyarrow"))
