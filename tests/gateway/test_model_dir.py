"""Finding and reading the upstream's tokenizer (``--upstream-model-dir``, or a ``/v1/models`` root)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from sapwood.gateway.app import GatewayConfig, create_app
from sapwood.gateway.model_dir import folder_from_models, tokenizer_metadata
from sapwood.rollout.transports import MemoryTransport
from tests.support.tiny_tokenizer import write_tiny_tokenizer


def test_the_metadata_names_the_file_and_its_digest(tmp_path: Path) -> None:
    folder = write_tiny_tokenizer(tmp_path / "model")
    meta = tokenizer_metadata(folder)
    file = (folder / "tokenizer.json").resolve()
    assert meta == {"tokenizer": str(file), "tokenizer_sha256": hashlib.sha256(file.read_bytes()).hexdigest()}
    assert tokenizer_metadata(file) == meta, "the file itself names the same"


def test_a_folder_without_a_readable_tokenizer_is_refused_clearly(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"no tokenizer\.json in"):
        tokenizer_metadata(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"is not a tokenizer\.json the tokenizers library reads"):
        tokenizer_metadata(tmp_path)
    with pytest.raises(ValueError, match=r"no tokenizer\.json in"):
        create_app(GatewayConfig(upstreams=["http://stub"], upstream_model_dir=str(tmp_path / "missing")),
                   MemoryTransport())


def test_the_first_local_model_root_with_a_tokenizer_is_taken(tmp_path: Path) -> None:
    folder = write_tiny_tokenizer(tmp_path / "model")
    models = {"data": [{"id": "hub", "root": "Qwen/Qwen3-8B"}, {"id": "empty", "root": str(tmp_path)},
                       {"id": "tiny", "root": str(folder)}]}
    assert folder_from_models(models) == folder
    assert folder_from_models({"data": [{"id": "hub", "root": "Qwen/Qwen3-8B"}]}) is None
    for odd in (None, [], {"data": None}, {"data": [None, {"root": 3}]}):
        assert folder_from_models(odd) is None
