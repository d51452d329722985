"""The emoji grammar as vLLM 0.33's xgrammar backend compiles and applies it allows exactly what the
trainer's replayed masks allow, at every position (issue 14, point 4), on the Qwen3.5 vocabulary.

vLLM's side runs its own code in the contract venv (contract.py `grammar`): the request our rollout
sampler builds, its SamplingParams updated from the model directory's generation config, the stop
set that gives, and XgrammarBackend (which blanks special tokens in the vocabulary it compiles EBNF
with) compiling the grammar with those stop tokens. The trainer's side: `compile_emoji_grammar` on
the tokenizer loaded from the same directory, and `replay_masks`.

The model directory: the real Qwen3.5 vocabulary as an HF byte-level tokenizer (`tests.tiny`),
logits 248,320 wide. No package here ships Qwen3.5's generation_config.json, so its `eos_token_id`
is QWEN35_LIKE_EOS: the Qwen3 chat models' list, [<|im_end|>, <|endoftext|>], at their Qwen3.5 ids.
"""

from __future__ import annotations

import base64
import json
import random

import numpy as np
import pytest
from tests.tiny import QWEN3_5_LOGITS, qwen3_5_vocabulary
from transformers import AutoTokenizer
from transformers.convert_slow_tokenizer import bytes_to_unicode

from emoji_rl.decode.generate import Decoding
from emoji_rl.decode.logits import allowed_positions
from emoji_rl.decode.vllm import VLLMSampler
from emoji_rl.emoji.alphabet import ALPHABET
from emoji_rl.emoji.constraint import compile_emoji_grammar, replay_bitmask
from emoji_rl.emoji.qwen_vocab import qwen_tokenizer
from emoji_rl.io.endpoint import Endpoint
from emoji_rl.lm.template import end_of_turn_ids, stop_token_id

ENDOFTEXT, IM_START, IM_END, WIDTH = 248044, 248045, 248046, QWEN3_5_LOGITS
QWEN35_LIKE_EOS = [IM_END, ENDOFTEXT]  # labelled above: not read from a real Qwen3.5 checkpoint


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    tokenizer = qwen3_5_vocabulary()
    assert tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [
        ENDOFTEXT,
        IM_START,
        IM_END,
    ]
    path = tmp_path_factory.mktemp("qwen35-like")
    tokenizer.save_pretrained(path)
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": QWEN35_LIKE_EOS}))
    return path


def _messages(count: int) -> list[str]:
    rng = random.Random(14)
    messages = []
    for _ in range(count):
        emoji = rng.choices(ALPHABET, k=rng.randint(2, 8))
        messages.append(emoji[0] + "".join(rng.choice(["", " "]) + e for e in emoji[1:]))
    return messages


@pytest.fixture(scope="module")
def sides(model_dir, vllm_oracle):
    """(sequences, vLLM's answer, the trainer's tokenizer) for several messages, each ended by each
    stop id, canonically tokenized, plus one spelled byte by byte, and one ended by <|im_start|>."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    encode = qwen_tokenizer("qwen3.5").encode
    messages = _messages(4)
    sequences = [[*encode(m), end] for m in messages for end in QWEN35_LIKE_EOS]
    byte_id = {tokenizer.convert_tokens_to_ids(c): c for c in bytes_to_unicode().values()}
    by_byte = [tokenizer.convert_tokens_to_ids(bytes_to_unicode()[b]) for b in messages[0].encode()]
    assert len(byte_id) == 256
    sequences += [[*by_byte, IM_END], [*encode(messages[1]), IM_START]]
    sampler = VLLMSampler(Endpoint("http://127.0.0.1:9"), "policy", stop_token_id(tokenizer), Decoding())
    request = sampler.request_body([1, 2, 3], 0)
    answer = vllm_oracle(
        "grammar", model_dir=str(model_dir), vocab_size=WIDTH, request=request, sequences=sequences
    )
    return sequences, answer, tokenizer


def test_the_stop_set_is_vllms(sides):
    _, answer, tokenizer = sides
    assert answer["generation_eos"] == QWEN35_LIKE_EOS and answer["eos_token_id"] == IM_END
    assert answer["stop_token_ids"] == sorted(end_of_turn_ids(tokenizer)) == sorted(QWEN35_LIKE_EOS)


def test_vllm_and_the_trainer_allow_the_same_tokens_at_every_position(sides):
    sequences, answer, tokenizer = sides
    constraint = compile_emoji_grammar(tokenizer, vocab_size=WIDTH)
    valid = sequences[:-1]
    assert answer["accepted"][: len(valid)] == [len(s) for s in valid] and all(
        answer["terminated"][: len(valid)]
    )
    for sequence, vllm_masks in zip(valid, answer["masks"], strict=False):
        rows, ids = allowed_positions(replay_bitmask(constraint, sequence), WIDTH)
        assert len(vllm_masks) == len(sequence)
        for t, encoded in enumerate(vllm_masks):
            theirs = set(np.frombuffer(base64.b64decode(encoded), dtype=np.int32).tolist())
            mine = set(ids[rows == t].tolist())
            assert mine == theirs, (sequence, t, sorted(mine ^ theirs)[:20])


def test_both_refuse_a_message_ended_by_a_special_token_that_is_not_a_stop(sides):
    sequences, answer, tokenizer = sides
    bad = sequences[-1]
    assert answer["accepted"][-1] == len(bad) - 1 and not answer["terminated"][-1]
    with pytest.raises(ValueError, match=f"token {IM_START} at position {len(bad) - 1}"):
        replay_bitmask(compile_emoji_grammar(tokenizer, vocab_size=WIDTH), bad)
