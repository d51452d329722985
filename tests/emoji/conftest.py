"""Tiny HF tokenizers built in memory, for compiling the grammar without loading a model."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, decoders, pre_tokenizers
from tokenizers import models as token_models
from transformers import PreTrainedTokenizerFast

TEMPLATE = "{% for m in messages %}{{ m['content'] }}<|im_end|>{% endfor %}"


@pytest.fixture(scope="session")
def byte_level_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE with no merges: one token per byte (ids 0-255), `<|im_end|>` (256)."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    backend = Tokenizer(token_models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, chat_template=TEMPLATE)
    tokenizer.add_special_tokens({"eos_token": "<|im_end|>"})
    return tokenizer


def _word_level_tokenizer(eos: bool) -> PreTrainedTokenizerFast:
    vocab = {"[UNK]": 0, "hello": 1, "world": 2} | ({"<|im_end|>": 3} if eos else {})
    backend = Tokenizer(token_models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="[UNK]",
        eos_token="<|im_end|>" if eos else None,
        chat_template=TEMPLATE,
    )


@pytest.fixture(scope="session")
def word_level_tokenizer() -> PreTrainedTokenizerFast:
    """Whole words only: no byte of any emoji is a token."""
    return _word_level_tokenizer(eos=True)


@pytest.fixture(scope="session")
def tokenizer_without_eos() -> PreTrainedTokenizerFast:
    return _word_level_tokenizer(eos=False)
