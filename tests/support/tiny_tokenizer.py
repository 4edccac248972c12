"""A tiny byte-level BPE ``tokenizer.json`` trained locally with the ``tokenizers`` library (no download)."""

from __future__ import annotations

from pathlib import Path

TEXT = ["the store keeps each prefix once", "a fork shares its prefix", "<|im_start|>user fix it<|im_end|>"]


def write_tiny_tokenizer(folder: Path) -> Path:
    """Train a 300-id tokenizer on :data:`TEXT` and save ``folder/tokenizer.json``; returns ``folder``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(TEXT * 20, trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    return folder


__all__ = ["TEXT", "write_tiny_tokenizer"]
