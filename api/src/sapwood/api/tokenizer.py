"""Pluggable decoding of token ids into text for audits.

``SAPWOOD_TOKENIZER`` selects it: ``"none"`` (default, no text), ``"char"`` (the built-in
char-level vocabulary: token id = Unicode code point), a local ``tokenizer.json`` file or a
Hugging Face tokenizer folder holding one (read with the ``tokenizers`` library, never from the
network), or a dotted path to a zero-argument factory, ``"package.module:factory"``
(``"package.module.factory"`` works too), returning any object with ``decode(ids) -> str``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from sapwood.platform.errors import ValidationError

REPLACEMENT = "\ufffd"


@runtime_checkable
class Tokenizer(Protocol):
    """Anything that turns token ids back into text."""

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``; ids outside the vocabulary decode to U+FFFD, never raise."""
        ...


class CharTokenizer:
    """Char-level vocabulary: id ``i`` is ``alphabet[i]``, or code point ``i`` when no alphabet is given."""

    def __init__(self, alphabet: str | None = None) -> None:
        self.alphabet = alphabet

    def decode(self, ids: Sequence[int]) -> str:
        if self.alphabet is not None:
            a, n = self.alphabet, len(self.alphabet)
            return "".join(a[i] if 0 <= i < n else REPLACEMENT for i in ids)
        return "".join(chr(i) if 0 <= i < 0x110000 and not 0xD800 <= i < 0xE000 else REPLACEMENT for i in ids)

    def encode(self, text: str) -> list[int]:
        if self.alphabet is None:
            return [ord(c) for c in text]
        index = {c: i for i, c in enumerate(self.alphabet)}
        missing = sorted({c for c in text if c not in index})
        if missing:
            raise ValidationError(f"characters {missing!r} are not in the tokenizer's alphabet")
        return [index[c] for c in text]


class FileTokenizer:
    """A Hugging Face ``tokenizer.json`` read with the ``tokenizers`` library; ids outside its vocabulary
    decode to U+FFFD (each), special tokens are shown."""

    def __init__(self, path: Path) -> None:
        try:
            from tokenizers import Tokenizer as HFTokenizer
        except ImportError as exc:
            raise ValidationError(f"SAPWOOD_TOKENIZER={path}: the tokenizers library is not installed "
                                  "(pip install 'sapwood[api]')") from exc
        try:
            self._tok: Any = HFTokenizer.from_file(str(path))
        except Exception as exc:
            raise ValidationError(f"SAPWOOD_TOKENIZER={path}: not a tokenizer.json ({exc})") from exc
        self.path = path
        self.vocab_size = int(self._tok.get_vocab_size(with_added_tokens=True))

    def decode(self, ids: Sequence[int]) -> str:
        out: list[str] = []
        run: list[int] = []
        for i in ids:
            if 0 <= i < self.vocab_size:
                run.append(int(i))
                continue
            if run:
                out.append(self._tok.decode(run, skip_special_tokens=False))
                run = []
            out.append(REPLACEMENT)
        if run:
            out.append(self._tok.decode(run, skip_special_tokens=False))
        return "".join(out)

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)


def _tokenizer_file(spec: str) -> Path | None:
    """The ``tokenizer.json`` that ``spec`` names (the file, or a folder holding one), if it does."""
    path = Path(spec).expanduser()
    if path.is_dir() and (path / "tokenizer.json").is_file():
        return path / "tokenizer.json"
    if path.is_file():
        return path
    return None


def char_tokenizer() -> CharTokenizer:
    """Factory of the built-in char-level tokenizer (``SAPWOOD_TOKENIZER=char``)."""
    return CharTokenizer()


def load_tokenizer(spec: str) -> Tokenizer | None:
    """Tokenizer named by ``spec`` (see the module docstring); None for ``"none"``."""
    spec = spec.strip()
    if spec.lower() in ("", "none", "recorded"):  # recorded: per execution (sapwood.api.recorded_tokenizer)
        return None
    if spec.lower() == "char":
        return char_tokenizer()
    file = _tokenizer_file(spec)
    if file is not None:
        return FileTokenizer(file)
    if "/" in spec or spec.endswith(".json"):
        raise ValidationError(f"SAPWOOD_TOKENIZER={spec!r}: no tokenizer.json there (a file, or a folder holding one)")
    module_name, sep, attr = spec.partition(":")
    if not sep:
        module_name, _, attr = spec.rpartition(".")
    if not module_name or not attr:
        raise ValidationError(f'SAPWOOD_TOKENIZER={spec!r}: expected "none", "char" or "package.module:factory"')
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ValidationError(f"SAPWOOD_TOKENIZER={spec!r}: cannot import it ({exc})") from exc
    try:
        tokenizer = factory() if callable(factory) else factory
    except Exception as exc:
        raise ValidationError(f"SAPWOOD_TOKENIZER={spec!r}: the factory failed ({type(exc).__name__}: {exc})") from exc
    if not isinstance(tokenizer, Tokenizer):
        raise ValidationError(f"SAPWOOD_TOKENIZER={spec!r} gave {type(tokenizer).__name__}, which has no decode(ids)")
    return tokenizer


def per_token_text(decode: Callable[[Sequence[int]], str], ids: Sequence[int]) -> list[str]:
    """Each token decoded on its own (for a per-token heat map): one string per id, in order."""
    return [decode([i]) for i in ids]
