"""The emoji grammar, its compilation per vocabulary, and mask replay (no model: tiny vocabularies)."""

from __future__ import annotations

import copy
import json
import random

import pytest
import torch

from emoji_rl.emoji.alphabet import ALPHABET
from emoji_rl.emoji.constraint import (
    MAX_EMOJI_BYTES,
    RawVocab,
    byte_vocab,
    compile_emoji_grammar,
    compile_emoji_grammar_raw,
    grammar_ebnf,
    grammar_support,
    pack_bitmask,
    replay_masks,
    safe_max_new_tokens,
    support_masks,
    unpack_bitmask,
    vllm_structured_outputs,
)
from emoji_rl.errors import UserError
from emoji_rl.lm.template import end_of_turn_ids

END = 256  # end of turn in byte_vocab()


def test_grammar_is_built_from_the_alphabet() -> None:
    ebnf = grammar_ebnf()
    assert ebnf.startswith('root ::= emoji (" "? emoji){1,7}\n')
    assert ebnf.count('"') == 2 * len(ALPHABET) + 2
    assert all(f'"{e}"' in ebnf for e in ALPHABET)
    assert grammar_ebnf(1, 1).startswith("root ::= emoji\n")
    assert grammar_ebnf(3, 5).startswith('root ::= emoji (" "? emoji){2,4}\n')


@pytest.mark.parametrize(("low", "high"), [(0, 8), (3, 2), (-1, -1)])
def test_bad_bounds_are_a_user_error(low: int, high: int) -> None:
    with pytest.raises(UserError, match="need 1 <= min_emoji <= max_emoji"):
        grammar_ebnf(low, high)


def test_vllm_field_is_the_grammar_and_survives_json() -> None:
    field = vllm_structured_outputs()
    assert field == {"grammar": grammar_ebnf()}
    # vLLM reads a grammar holding "::=" as EBNF (docs/VLLM.md §2); ASCII JSON escapes the emoji.
    assert "::=" in field["grammar"]
    assert json.loads(json.dumps({"structured_outputs": field}))["structured_outputs"] == field


def test_safe_budget_covers_the_longest_message_byte_by_byte() -> None:
    assert MAX_EMOJI_BYTES == 35
    assert safe_max_new_tokens(8) == 8 * 35 + 7 + 1 == 288
    longest = max(ALPHABET, key=lambda e: len(e.encode()))
    constraint = compile_emoji_grammar_raw(byte_vocab())
    ids = [*" ".join([longest] * 8).encode(), END]
    assert len(ids) == constraint.max_new_tokens
    assert replay_masks(constraint, ids).shape == (288, 257)


def test_replayed_masks_follow_the_message() -> None:
    constraint = compile_emoji_grammar_raw(byte_vocab())
    pizza = "🍕".encode()
    masks = replay_masks(constraint, [*pizza, *pizza, END])
    first_bytes = {e.encode()[0] for e in ALPHABET}
    assert set(masks[0].nonzero().flatten().tolist()) == first_bytes
    assert masks[1].nonzero().flatten().tolist() == [0x9F]  # every 4-byte emoji starts F0 9F
    assert not masks[4, END]  # one emoji: end of turn not yet allowed
    assert masks[8, END] and masks[8, ord(" ")]  # two emoji: end, space or a third emoji


def test_after_eight_emoji_only_end_of_turn_is_allowed() -> None:
    masks = replay_masks(compile_emoji_grammar_raw(byte_vocab()), [*("🍕" * 8).encode(), END])
    assert masks[-1].nonzero().flatten().tolist() == [END]


def test_unpacked_masks_match_the_matcher_token_by_token() -> None:
    constraint = compile_emoji_grammar_raw(byte_vocab())
    ids = [*"👍🏻 🏳️‍🌈".encode(), END]
    masks = replay_masks(constraint, ids)
    matcher = constraint.matcher()
    for t, token_id in enumerate(ids):
        accepted = [matcher.fork().accept_token(i) for i in range(257)]
        assert masks[t].tolist() == accepted
        assert matcher.accept_token(token_id)


def test_pack_bitmask_is_unpack_bitmasks_inverse() -> None:
    ids = torch.tensor([0, 5, 31, 63, 66])  # 31 and 63: the int32 sign bits of words 0 and 1
    packed = pack_bitmask(ids, 70)
    assert packed.dtype == torch.int32 and packed.shape == (3,) and packed[0] < 0 and packed[1] < 0
    assert unpack_bitmask(packed, 70).nonzero().flatten().tolist() == ids.tolist()


def test_unpack_bitmask_bit_order() -> None:
    words = torch.tensor([[1 | (1 << 5), -(2**31), 1 << 2]], dtype=torch.int32)
    assert unpack_bitmask(words, 70).nonzero()[:, 1].tolist() == [0, 5, 63, 66]


def test_replay_rejects_ids_the_grammar_does_not_allow() -> None:
    constraint = compile_emoji_grammar_raw(byte_vocab())
    with pytest.raises(ValueError, match="position 4 is not allowed"):
        replay_masks(constraint, [*"🍕".encode(), ord("a")])
    with pytest.raises(ValueError, match="follows end of turn"):
        replay_masks(constraint, [*"🍕🍕".encode(), END, END])


def test_hf_byte_level_tokenizer_compiles_and_accepts_its_own_tokenization(byte_level_tokenizer) -> None:
    tokenizer = byte_level_tokenizer
    constraint = compile_emoji_grammar(tokenizer)
    assert constraint.vocab_size == len(tokenizer) == 257
    assert constraint.stop_token_ids == end_of_turn_ids(tokenizer) == (tokenizer.eos_token_id,)
    ids = tokenizer("🍕 👨‍👩‍👧 🎉", add_special_tokens=False)["input_ids"]
    assert replay_masks(constraint, [*ids, tokenizer.eos_token_id]).shape == (len(ids) + 1, 257)


def test_compiled_grammar_is_cached_per_vocabulary_and_bounds(byte_level_tokenizer) -> None:
    tokenizer = byte_level_tokenizer
    first = compile_emoji_grammar(tokenizer)
    assert compile_emoji_grammar(copy.deepcopy(tokenizer)) is first
    assert compile_emoji_grammar(tokenizer, 2, 4) is not first
    assert compile_emoji_grammar(tokenizer, vocab_size=320).vocab_size == 320
    assert compile_emoji_grammar(tokenizer, use_cache=False) is not first


def test_a_tokenizer_that_grows_gets_a_new_grammar(byte_level_tokenizer) -> None:
    tokenizer = copy.deepcopy(byte_level_tokenizer)
    first = compile_emoji_grammar(tokenizer)
    tokenizer.add_tokens(["<extra>"])  # the vocabulary read for the cache key is read again
    grown = compile_emoji_grammar(tokenizer)
    assert grown is not first
    assert (first.vocab_size, grown.vocab_size) == (257, 258)


def test_tokenizer_without_emoji_bytes_fails_at_compile_time(word_level_tokenizer) -> None:
    with pytest.raises(
        UserError, match=r"cannot express the emoji grammar: it has no single-byte token for 69"
    ):
        compile_emoji_grammar(word_level_tokenizer)


def test_tokenizer_without_end_of_turn_fails_at_compile_time(tokenizer_without_eos) -> None:
    with pytest.raises(UserError, match="no end-of-turn token"):
        compile_emoji_grammar(tokenizer_without_eos)


def test_raw_vocab_missing_a_byte_fails_and_names_it() -> None:
    tokens = [bytes([b]) for b in range(256) if b != 0x9F] + [b"<|end|>"]
    vocab = RawVocab("no-0x9F", tuple(tokens), (255,), 256)
    with pytest.raises(UserError, match=r"no single-byte token for 1 of the 69 bytes .*0x9F"):
        compile_emoji_grammar_raw(vocab)


def test_stop_token_outside_the_logits_is_a_user_error(byte_level_tokenizer) -> None:
    with pytest.raises(UserError, match="not all below vocab_size=257"):
        compile_emoji_grammar(byte_level_tokenizer, stop_token_ids=[300])


def test_the_support_holds_the_tokens_that_fit_inside_a_message() -> None:
    pizza = "🍕".encode()  # F0 9F 8D 95
    tokens = (
        pizza,  # a whole emoji
        pizza[-1:] + b" " + "🎉".encode()[:1],  # the end of one, the separator, the start of the next
        b"a",
        pizza[2:] + "🎉".encode()[:2],  # across two emoji written together
        b"\xf0\xf0",  # two lead bytes: inside no emoji, nor across two
        b"",
        b"<|end|>",
    )
    assert grammar_support(tokens, stop_token_ids=(6,)) == [0, 1, 3, 6]


def _random_messages(count: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [
        rng.choice(["", " "]).join(rng.choice(ALPHABET) for _ in range(rng.randint(2, 8)))
        for _ in range(count)
    ]


def test_the_support_covers_every_mask_and_the_support_masks_are_the_masks_read_there(
    smollm2_tokenizer,
) -> None:
    from emoji_rl.emoji.qwen_vocab import qwen_raw_vocab, qwen_tokenizer

    qwen = qwen_raw_vocab("qwen3.5")
    vocabularies = [
        (compile_emoji_grammar(smollm2_tokenizer), lambda text: smollm2_tokenizer.encode(text)),
        (compile_emoji_grammar_raw(qwen), qwen_tokenizer("qwen3.5").encode),
    ]
    for constraint, encode in vocabularies:
        support = constraint.support
        seen = torch.zeros(constraint.vocab_size, dtype=torch.bool)
        for message in _random_messages(100):
            ids = [*encode(message), constraint.stop_token_ids[0]]
            masks = replay_masks(constraint, ids)
            seen |= masks.any(0)
            assert torch.equal(support_masks(constraint, ids), masks[:, support])
        assert seen[support].sum() == seen.sum()  # nothing the grammar allowed lies outside
        assert len(support) < 300 < constraint.vocab_size / 100
    assert len(vocabularies[1][0].support) == 240


def test_a_support_missing_an_allowed_token_is_caught(smollm2_tokenizer) -> None:
    constraint = copy.copy(compile_emoji_grammar(smollm2_tokenizer))
    ids = [*smollm2_tokenizer.encode("🍕 🎉"), constraint.stop_token_ids[0]]
    constraint.__dict__["support"] = constraint.support[constraint.support != ids[0]]
    constraint.__dict__.pop("support_bitmask", None)  # computed from the support above
    with pytest.raises(RuntimeError, match=f"allowed token {ids[0]} at position 0 .* grammar_support missed"):
        support_masks(constraint, ids)
