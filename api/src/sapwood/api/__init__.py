"""sapwood.api: the REST API over trajectory trees — queries, exact-context audit, replay runs, Parquet export."""

from sapwood.api.config import ApiSettings
from sapwood.api.main import create_app
from sapwood.api.tokenizer import CharTokenizer, Tokenizer

__all__ = ["ApiSettings", "CharTokenizer", "Tokenizer", "create_app"]
