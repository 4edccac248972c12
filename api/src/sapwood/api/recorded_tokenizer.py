"""``SAPWOOD_TOKENIZER=recorded``: text from the tokenizer an execution's recording named.

The recording gateway puts the upstream's tokenizer in each execution's metadata (``tokenizer``: the
absolute path of its ``tokenizer.json``; ``tokenizer_sha256``: the file's digest). Audits and node pages
of such an execution decode with that file when it is readable here and its digest still matches (a
file changed since the recording would put the wrong text on the ids, so it is not used); otherwise they
carry no text, as without a tokenizer. Loaded tokenizers are kept per (path, digest).
"""

from __future__ import annotations

import hashlib
import logging
import threading
from pathlib import Path
from typing import Any

from sqlalchemy.engine import Connection

from sapwood.api.tokenizer import FileTokenizer, Tokenizer
from sapwood.platform.errors import SapwoodError
from sapwood.platform.storage.executions import execution_row

log = logging.getLogger(__name__)


class RecordedTokenizers:
    """The tokenizer each execution's metadata names, loaded once per (path, digest)."""

    def __init__(self) -> None:
        self._loaded: dict[tuple[str, str], Tokenizer | None] = {}
        self._lock = threading.Lock()

    def for_metadata(self, metadata: Any) -> Tokenizer | None:
        """The tokenizer ``metadata`` names, if its file is readable here with the recorded digest."""
        if not isinstance(metadata, dict):
            return None
        path, digest = metadata.get("tokenizer"), metadata.get("tokenizer_sha256")
        if not isinstance(path, str) or not isinstance(digest, str):
            return None
        key = (path, digest)
        with self._lock:
            if key not in self._loaded:
                self._loaded[key] = _load(Path(path), digest)
            return self._loaded[key]

    def for_execution(self, conn: Connection, execution_id: str) -> Tokenizer | None:
        """The tokenizer the execution's recording named (None: none named, unreadable or changed)."""
        try:
            return self.for_metadata(execution_row(conn, execution_id)["metadata"])
        except SapwoodError:
            return None


def _load(path: Path, digest: str) -> Tokenizer | None:
    try:
        data = path.read_bytes()
    except OSError as exc:
        log.info("recorded tokenizer %s is not readable here: %s", path, exc)
        return None
    if hashlib.sha256(data).hexdigest() != digest:
        log.warning("recorded tokenizer %s changed since the recording (digest differs): not used", path)
        return None
    try:
        return FileTokenizer(path)
    except SapwoodError as exc:
        log.warning("recorded tokenizer %s: %s", path, exc)
        return None


__all__ = ["RecordedTokenizers"]
