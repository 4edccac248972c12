"""The upstream's tokenizer, read from its model folder, named in each execution the gateway records.

``--upstream-model-dir DIR`` names the folder given to ``vllm serve`` (or any folder holding the model's
``tokenizer.json``); without it the gateway asks the first upstream's ``GET /v1/models`` and takes the
first model ``root`` that is a folder readable here with a ``tokenizer.json`` (vLLM answers the path it
serves from). The tokenizer is read with the ``tokenizers`` library (never from the network) to check it
loads; each execution's metadata then holds ``tokenizer`` (the file's absolute path) and
``tokenizer_sha256`` (its content digest), and the API (``SAPWOOD_TOKENIZER=recorded``) decodes audits
and viewer pages with it when that file is readable there with the same digest.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any


def tokenizer_file(folder: str | Path) -> Path:
    """The ``tokenizer.json`` of a model folder (or the file itself); ValueError when there is none."""
    path = Path(folder).expanduser().resolve()
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        raise ValueError(f"no tokenizer.json in {path} (give the folder vLLM serves the model from)")
    return file


def tokenizer_metadata(folder: str | Path) -> dict[str, str]:
    """``{"tokenizer": path, "tokenizer_sha256": digest}`` of a model folder's tokenizer, after checking
    that the ``tokenizers`` library reads it (ValueError names what is wrong)."""
    file = tokenizer_file(folder)
    data = file.read_bytes()
    try:
        from tokenizers import Tokenizer
    except ImportError as exc:  # pragma: no cover - in the gateway extra
        raise ValueError("reading the upstream's tokenizer needs the tokenizers library (the gateway extra)") from exc
    try:
        Tokenizer.from_str(data.decode())
    except Exception as exc:
        raise ValueError(f"{file} is not a tokenizer.json the tokenizers library reads ({exc})") from exc
    return {"tokenizer": str(file), "tokenizer_sha256": hashlib.sha256(data).hexdigest()}


def folder_from_models(answer: Any) -> Path | None:
    """The first model folder an OpenAI ``/v1/models`` answer names (``data[].root``) that holds a
    ``tokenizer.json`` readable here; None when none does (a remote upstream, a hub model name)."""
    data = answer.get("data") if isinstance(answer, dict) else None
    for model in data if isinstance(data, list) else ():
        root = model.get("root") if isinstance(model, dict) else None
        if isinstance(root, str) and root and (Path(root) / "tokenizer.json").is_file():
            return Path(root)
    return None


__all__ = ["folder_from_models", "tokenizer_file", "tokenizer_metadata"]
