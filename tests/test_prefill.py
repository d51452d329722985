from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from emoji_rl.prefill import (
    PrefixPlan,
    can_share_prefixes,
    left_pad,
    plan_prefixes,
    prefill_inputs,
    prefill_tokens,
)

# Two groups of two identical prompts, as turn 1 of B=2, G=2.
GROUPS = [(1, 2, 3, 4), (1, 2, 3, 4), (1, 2, 5, 6, 7), (1, 2, 5, 6, 7)]


def test_plan_picks_the_split_that_reads_fewest_tokens():
    # Sorted neighbours share 3 (capped: each row keeps its last token), 2, and 4 tokens. Plain
    # padding reads 4 x 5 = 20. One cluster on the common (1, 2): 1 x 2 + 4 x 3 = 14. A cluster per
    # group: prefixes 3 and 4, padded to 4, twice, plus rests of 1: 2 x 4 + 4 x 1 = 12. Splitting
    # the first group apart: 3 x 4 + 4 x 4 = 28.
    plan = plan_prefixes(GROUPS)
    assert plan == PrefixPlan(cluster=(0, 0, 1, 1), prefix=(3, 4))
    assert prefill_tokens(GROUPS, plan) == 12
    assert prefill_tokens(GROUPS, None) == 20
    assert prefill_tokens(GROUPS, PrefixPlan((0, 0, 0, 0), (2,))) == 14


def test_plan_keeps_row_order_whatever_the_sort():
    rows = [GROUPS[2], GROUPS[0], GROUPS[3], GROUPS[1]]
    assert plan_prefixes(rows) == PrefixPlan(cluster=(1, 0, 1, 0), prefix=(3, 4))


def test_no_plan_when_sharing_saves_too_little():
    assert plan_prefixes([(1, 2), (3, 4)]) is None
    assert plan_prefixes([(1, 2, 3)]) is None
    # One shared token of 3: plain 2 x 3 = 6, shared 1 + 2 x 2 = 5, a saving of 1/6.
    assert plan_prefixes([(1, 2, 3), (1, 9, 9)]) is None
    assert plan_prefixes([(1, 2, 3), (1, 9, 9)], min_saving=0.0) == PrefixPlan((0, 0), (1,))


def test_left_pad_right_aligns_rows():
    ids, mask = left_pad([(5, 6), (), (7,)], pad_id=0, width=3)
    assert ids.tolist() == [[0, 5, 6], [0, 0, 0], [0, 0, 7]]
    assert mask.tolist() == [[0, 1, 1], [0, 0, 0], [0, 0, 1]]


def test_only_full_attention_models_share():
    from transformers import LlamaConfig, MistralConfig, Qwen3_5TextConfig

    def model(config):
        return SimpleNamespace(config=config)

    assert can_share_prefixes(model(LlamaConfig(num_hidden_layers=2)))
    assert not can_share_prefixes(model(MistralConfig(num_hidden_layers=2, sliding_window=16)))
    # Qwen3.5: Gated DeltaNet layers between the attention layers.
    assert not can_share_prefixes(model(Qwen3_5TextConfig(num_hidden_layers=4)))


@pytest.mark.slow
def test_shared_prefix_generation_equals_one_row_at_a_time(smollm2_model, smollm2_tokenizer):
    from emoji_rl.generate import generate_from_ids
    from emoji_rl.models import chat_ids

    def prompt(text: str) -> tuple[int, ...]:
        return tuple(chat_ids(smollm2_tokenizer, [{"role": "user", "content": text}]))

    first, second = prompt("I missed the train again"), prompt("Happy birthday, have fun!")
    # Turn-2-like rows: a group's shared head, then different continuations of unequal length.
    rows = [first, first, (*first, 28, 29, 30), (*first, 31), second, (*second, 32, 33)]
    ids, mask, cache = prefill_inputs(smollm2_model, rows, smollm2_tokenizer.pad_token_id)
    assert cache is not None, "these rows share long prefixes: the test must exercise sharing"
    assert cache.get_seq_length() < ids.shape[1]
    for row, prompt_ids in enumerate(rows):
        assert ids[row][mask[row].bool()].tolist() == list(prompt_ids)

    def sample(batch_size: int):
        return generate_from_ids(
            smollm2_model,
            smollm2_tokenizer,
            rows,
            constraint="grammar",
            temperature=0.0,
            max_new_tokens=12,
            batch_size=batch_size,
            return_logprobs=True,
        )

    shared, alone = sample(len(rows)), sample(1)
    for a, b in zip(shared, alone, strict=True):
        assert a.token_ids == b.token_ids
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)
