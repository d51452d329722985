"""The logits processors inside batched decoding (`emoji_rl.decode.generate.decode`): a tiny random Llama over a one-token-per-byte
vocabulary (fast: it wanders through byte-level paths no trained model takes), then the embedded
SmolLM2 for the acceptance figures of issue 2, item 4 (slow)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator

import pytest
import torch
import xgrammar as xgr
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    LogitsProcessor,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from emoji_rl.decode.generate import decode
from emoji_rl.decode.logits import (
    EmojiLogitsProcessor,
    StaticMaskLogitsProcessor,
    allowed_positions,
    mask_logits_,
    mask_logits_to_support_,
    static_allowed_ids,
)
from emoji_rl.decode.prefill import Prefilled
from emoji_rl.emoji.alphabet import ALPHABET, parse_message
from emoji_rl.emoji.constraint import compile_emoji_grammar, replay_masks
from emoji_rl.emoji.sender_prompts import sender_messages
from emoji_rl.errors import UserError
from emoji_rl.lm import template

TARGETS = [
    "I'm so excited for our beach trip this weekend",
    "My cat knocked the birthday cake off the table",
    "Let's grab pizza and watch a movie tonight",
    "I failed my driving test again and I feel terrible",
    "The meeting moved to Thursday at noon",
    "We adopted a puppy and named him Biscuit",
    "It rained all day so we stayed in and baked bread",
    "Congratulations on your new job in Tokyo",
]


def sample(
    model: PreTrainedModel,
    prompts: list[list[int]],
    per_prompt: int,
    processor: LogitsProcessor,
    max_new_tokens: int,
    pad_id: int,
    stop_id: int,
) -> list[list[int]]:
    """Sampled ids at temperature 1 (no top-k/top-p), `per_prompt` rows per left-padded prompt, each
    cut after its first end of turn. The prompts are prefilled once and their cache repeated: the same
    distribution as repeating the prompts, for 1/per_prompt of the prefill, which dominates on 2 cores."""
    width = max(map(len, prompts))
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts])
    mask = (torch.arange(width) >= torch.tensor([width - len(p) for p in prompts])[:, None]).long()
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # what decode derives from the mask
    with torch.no_grad():
        prefill = model(input_ids=ids[:, :-1], attention_mask=mask[:, :-1], position_ids=positions[:, :-1])
    cache = prefill.past_key_values
    cache.batch_repeat_interleave(per_prompt)
    ids, mask = ids.repeat_interleave(per_prompt, 0), mask.repeat_interleave(per_prompt, 0)
    rows = decode(model, Prefilled(ids, mask, cache), processor, 1.0, max_new_tokens, [stop_id], pad_id)
    return [tokens for tokens, _, _ in rows]


def check_rows(
    rows: list[list[int]], tokenizer: PreTrainedTokenizerBase, processor: EmojiLogitsProcessor
) -> list[str]:
    """Every row ends with end of turn, parses, and was masked exactly as a replay masks it."""
    texts = []
    for row_index, row in enumerate(rows):
        text = tokenizer.decode(row, skip_special_tokens=True)
        assert row[-1] in processor.constraint.stop_token_ids, (text, row)
        assert parse_message(text).ok, (text, parse_message(text).reason)
        assert torch.equal(replay_masks(processor.constraint, row), processor.applied_masks(row_index))
        texts.append(text)
    return texts


@pytest.fixture(scope="module")
def tiny_model(byte_level_tokenizer) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    tokenizer = byte_level_tokenizer
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=512,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.eos_token_id,
    )
    return LlamaForCausalLM(config).eval(), tokenizer


def test_random_model_under_the_grammar_writes_only_valid_messages(tiny_model) -> None:
    model, tokenizer = tiny_model
    constraint = compile_emoji_grammar(tokenizer)
    processor = EmojiLogitsProcessor(constraint, record_masks=True)
    prompts = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in TARGETS]
    eos = tokenizer.eos_token_id
    # The safe budget: a random model spells emoji byte by byte, yet every row must end in time.
    rows = sample(model, prompts, 4, processor, constraint.max_new_tokens, eos, eos)
    assert len(check_rows(rows, tokenizer, processor)) == 32
    print(f"\nrandom model: tokens per message {sorted(map(len, rows))}")


class NoDeviceReads(EmojiLogitsProcessor):
    """The processor fed only the shape of `input_ids` (a meta tensor holds no values): any read of
    the sampled ids from it, which on a GPU waits for the forward pass, raises."""

    def __call__(self, input_ids, scores):
        return super().__call__(input_ids if not self._matchers else input_ids.to("meta"), scores)


def test_decode_hands_the_grammar_the_sampled_ids_from_the_host(tiny_model) -> None:
    model, tokenizer = tiny_model
    constraint = compile_emoji_grammar(tokenizer)
    prompts = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in TARGETS[:2]]
    eos = tokenizer.eos_token_id
    processor = NoDeviceReads(constraint, record_masks=True)
    rows = sample(model, prompts, 2, processor, constraint.max_new_tokens, eos, eos)
    assert len(check_rows(rows, tokenizer, processor)) == 4
    unfed = NoDeviceReads(constraint)  # not advanced: it must read the ids, and cannot
    unfed(torch.zeros(1, 3, dtype=torch.long), torch.zeros(1, 257))
    with pytest.raises(NotImplementedError, match="meta tensor"):
        unfed(torch.zeros(1, 4, dtype=torch.long), torch.zeros(1, 257))


def test_static_mask_only_lets_emoji_pieces_through(byte_level_tokenizer) -> None:
    tokenizer = byte_level_tokenizer
    allowed = static_allowed_ids(tokenizer)
    # One token per byte: the 69 bytes emoji are made of, the space and end of turn.
    assert len(allowed) == len({b for e in ALPHABET for b in e.encode()}) + 2 == 71
    assert {tokenizer.eos_token_id, *tokenizer(" ", add_special_tokens=False)["input_ids"]} < allowed
    scores = StaticMaskLogitsProcessor(tokenizer)(torch.zeros(2, 1, dtype=torch.long), torch.zeros(2, 257))
    assert torch.isfinite(scores).sum(-1).tolist() == [len(allowed)] * 2


def test_processor_refuses_a_second_batch(byte_level_tokenizer) -> None:
    constraint = compile_emoji_grammar(byte_level_tokenizer)
    processor = EmojiLogitsProcessor(constraint)
    processor(torch.zeros(2, 5, dtype=torch.long), torch.zeros(2, 257))
    with pytest.raises(RuntimeError, match="create a new processor for each batch decoded"):
        processor(torch.zeros(2, 9, dtype=torch.long), torch.zeros(2, 257))


def test_processor_refuses_logits_of_another_width(byte_level_tokenizer) -> None:
    processor = EmojiLogitsProcessor(compile_emoji_grammar(byte_level_tokenizer))
    with pytest.raises(UserError, match="mask is 257 tokens wide but the model's logits are 300"):
        processor(torch.zeros(2, 5, dtype=torch.long), torch.zeros(2, 300))


def test_ended_rows_may_only_repeat_end_of_turn(byte_level_tokenizer) -> None:
    processor = EmojiLogitsProcessor(compile_emoji_grammar(byte_level_tokenizer))
    eos = byte_level_tokenizer.eos_token_id
    ids = [0, *byte_level_tokenizer("🍕🍕", add_special_tokens=False)["input_ids"], eos]
    for length in range(1, len(ids) + 1):
        scores = processor(torch.tensor([ids[:length]]), torch.zeros(1, 257))
    assert torch.isfinite(scores[0]).nonzero().flatten().tolist() == [eos]


def test_allowed_positions_reads_bits_low_first_up_to_the_width() -> None:
    # Row 0: word 0 = 0b1011 (tokens 0, 1, 3), word 2 bit 5 (token 69). Row 1: word 1 bit 31, the
    # int32 sign bit (token 63).
    bitmask = torch.tensor([[0b1011, 0, 1 << 5], [0, -(2**31), 0]], dtype=torch.int32)
    rows, ids = allowed_positions(bitmask, 70)
    assert list(zip(rows.tolist(), ids.tolist(), strict=True)) == [(0, 0), (0, 1), (0, 3), (0, 69), (1, 63)]
    rows, ids = allowed_positions(bitmask, 66)  # token 69 lies past 66 logits: no such token
    assert ids.tolist() == [0, 1, 3, 63]
    scores = mask_logits_(torch.arange(140.0).view(2, 70), bitmask)
    assert torch.isfinite(scores).nonzero().tolist() == [[0, 0], [0, 1], [0, 3], [0, 69], [1, 63]]
    assert scores[0, [0, 1, 3, 69]].tolist() == [0.0, 1.0, 3.0, 69.0] and scores[1, 63].item() == 133.0


@pytest.mark.parametrize("width", [1, 32, 70, 257])
@pytest.mark.parametrize("density", [0.0, 0.02, 0.5, 1.0])
def test_mask_logits_masks_as_xgrammar_does(width: int, density: float) -> None:
    generator = torch.Generator().manual_seed(width)
    words = -(-width // 32)
    bits = (torch.rand(3, words, 32, generator=generator) < density).long() << torch.arange(32)
    bitmask = bits.sum(-1).to(torch.int32)  # wraps bit 31 to the sign, as xgrammar stores it
    scores = torch.randn(3, width, generator=generator)
    expected = scores.clone()
    xgr.apply_token_bitmask_inplace(expected, bitmask)
    assert torch.equal(mask_logits_(scores, bitmask), expected)
    assert torch.equal(scores, expected)  # in place


def test_masking_through_the_support_is_xgrammars_masking(smollm2_tokenizer) -> None:
    """Bitmasks of 16 SmolLM2 rows along real messages (the first step allows every emoji's first
    token, the last only end of turn), the sign bit among them: the same scores as xgrammar's."""
    constraint = compile_emoji_grammar(smollm2_tokenizer)
    messages = [
        " ".join(ALPHABET[(7 * i + 3 * j) % len(ALPHABET)] for j in range(2 + i % 4)) for i in range(16)
    ]
    rows = [[*smollm2_tokenizer.encode(m), constraint.stop_token_ids[0]] for m in messages]
    matchers = [constraint.matcher() for _ in rows]
    bitmask = xgr.allocate_token_bitmask(len(rows), constraint.vocab_size)
    generator = torch.Generator().manual_seed(0)
    for step in range(max(map(len, rows))):
        for row, (matcher, ids) in enumerate(zip(matchers, rows, strict=True)):
            if step < len(ids):
                matcher.fill_next_token_bitmask(bitmask, row)
                assert matcher.accept_token(ids[step])
        scores = torch.randn(len(rows), constraint.vocab_size, generator=generator)
        expected = scores.clone()
        xgr.apply_token_bitmask_inplace(expected, bitmask)
        assert torch.equal(mask_logits_to_support_(scores, bitmask, constraint.support), expected)
        assert torch.equal(scores, expected)  # in place


@pytest.fixture(scope="module")
def smollm2_prompts(smollm2_tokenizer) -> list[list[int]]:
    return [template.chat_ids(smollm2_tokenizer, sender_messages(t)) for t in TARGETS]


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """Two OpenMP threads on two cores shared with other processes wait on each other at every op:
    a 4-token generate at batch 64 took 51 s with 2 threads and 4.7 s with 1 (load average 7)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.slow
@pytest.mark.usefixtures("one_torch_thread")
def test_smollm2_200_constrained_samples_all_parse_and_replay(
    smollm2_model, smollm2_tokenizer, smollm2_prompts
) -> None:
    constraint = compile_emoji_grammar(smollm2_tokenizer)
    processor = EmojiLogitsProcessor(constraint, record_masks=True)
    eos = smollm2_tokenizer.eos_token_id
    torch.manual_seed(0)
    rows = sample(smollm2_model, smollm2_prompts, 25, processor, constraint.max_new_tokens, eos, eos)
    texts = check_rows(rows, smollm2_tokenizer, processor)
    lengths = sorted(map(len, rows))
    longer = sum(n > 48 for n in lengths)
    print(f"\nSmolLM2 constrained: {len(texts)}/200 valid; tokens per message: median {lengths[100]}")
    print(f"  max {lengths[-1]}; {longer} rows would not have ended within 48 tokens")
    assert len(texts) == 200


@pytest.mark.slow
@pytest.mark.usefixtures("one_torch_thread")
def test_smollm2_static_mask_invalid_rate_is_measured(
    smollm2_model, smollm2_tokenizer, smollm2_prompts
) -> None:
    eos = smollm2_tokenizer.eos_token_id
    torch.manual_seed(0)
    # Same prompts and sampling as above on 64 rows. The static mask never forces an end: a row
    # without end of turn after 48 tokens (the grammar's rows took 26 at the median) counts invalid.
    processor = StaticMaskLogitsProcessor(smollm2_tokenizer)
    rows = sample(smollm2_model, smollm2_prompts, 8, processor, 48, eos, eos)
    texts = [smollm2_tokenizer.decode(row, skip_special_tokens=True) for row in rows]
    reasons = [
        parse_message(text).reason or ("" if row[-1] == eos else "no end of turn in 48 tokens")
        for row, text in zip(rows, texts, strict=True)
    ]
    rate = sum(map(bool, reasons)) / len(rows)
    print(f"\nSmolLM2 static-mask baseline: {rate:.0%} invalid ({sum(map(bool, reasons))}/{len(rows)})")
    kinds = Counter(re.split(r" '|:", reason)[0] or "valid" for reason in reasons)
    print("  " + ", ".join(f"{kind}: {count}" for kind, count in kinds.most_common()))
    print(f"  not ended in 48 tokens: {sum(row[-1] != eos for row in rows)}")
    for text, reason in list(zip(texts, reasons, strict=True))[::8]:
        print(f"  {text!r}: {reason or 'valid'}")
    assert 0.0 <= rate <= 1.0
