"""``SAPWOOD_TOKENIZER`` as a local tokenizer.json (or a Hugging Face folder holding one), no network."""

from __future__ import annotations

from pathlib import Path

import pytest

from sapwood.api.tokenizer import REPLACEMENT, FileTokenizer, load_tokenizer, per_token_text
from sapwood.platform.errors import ValidationError
from tests.support.tiny_tokenizer import TEXT, write_tiny_tokenizer


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_tokenizer(tmp_path_factory.mktemp("tiny-tokenizer"))


def test_a_folder_and_its_file_load_the_same_tokenizer_and_round_trip(tokenizer_dir: Path) -> None:
    by_folder, by_file = load_tokenizer(str(tokenizer_dir)), load_tokenizer(str(tokenizer_dir / "tokenizer.json"))
    assert isinstance(by_folder, FileTokenizer)
    assert isinstance(by_file, FileTokenizer)
    for text in TEXT:
        ids = by_folder.encode(text)
        assert by_folder.decode(ids) == text
        assert by_file.decode(ids) == text
    ids = by_folder.encode("<|im_start|>user")
    assert per_token_text(by_folder.decode, ids)[0] == "<|im_start|>", "special tokens are shown"


def test_ids_outside_the_vocabulary_decode_to_the_replacement_character(tokenizer_dir: Path) -> None:
    tok = load_tokenizer(str(tokenizer_dir))
    assert isinstance(tok, FileTokenizer)
    ids = tok.encode("fork")
    assert tok.decode([*ids, tok.vocab_size, -1, *ids]) == f"fork{REPLACEMENT}{REPLACEMENT}fork"
    assert tok.decode([]) == ""


def test_a_path_without_a_tokenizer_is_refused_clearly(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match=r"no tokenizer\.json there"):
        load_tokenizer(str(tmp_path / "missing" / "tokenizer.json"))
    with pytest.raises(ValidationError, match=r"no tokenizer\.json there"):
        load_tokenizer(str(tmp_path))  # a folder without one
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{not json")
    with pytest.raises(ValidationError, match=r"not a tokenizer\.json"):
        load_tokenizer(str(bad))
