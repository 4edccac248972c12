"""Fixtures of the verl suite (runs in verl's own venv): a tiny Hugging Face tokenizer with a chat template."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from tests.support.verl_trees import TOKENIZER_VOCAB as VOCAB

SPECIAL = ["<pad>", "<eos>", "<|user|>", "<|assistant|>", "<|tool|>", "<|end|>"]


@pytest.fixture(scope="session")
def hf_tokenizer() -> PreTrainedTokenizerFast:
    words = SPECIAL + [f"w{i}" for i in range(VOCAB - len(SPECIAL))]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="w0")
    hf.chat_template = ("{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} <|end|> {% endfor %}"
                        "{% if add_generation_prompt %}<|assistant|> {% endif %}")
    return hf
