from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from tests.floats import F64, float64, fp32_inside
from tests.tiny import tiny_qwen3_5

from emoji_rl.decode.prefill import (
    PrefixPlan,
    RowCache,
    can_share_prefixes,
    left_pad,
    plan_prefixes,
    prefill_inputs,
    prefill_tokens,
    resume_inputs,
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
@pytest.mark.float_paths
def test_shared_prefix_generation_equals_one_row_at_a_time(smollm2_model_f64, smollm2_tokenizer):
    from emoji_rl.decode.generate import Decoding, generate_from_ids
    from emoji_rl.lm.template import chat_ids

    def prompt(text: str) -> tuple[int, ...]:
        return tuple(chat_ids(smollm2_tokenizer, [{"role": "user", "content": text}]))

    first, second = prompt("I missed the train again"), prompt("Happy birthday, have fun!")
    # Turn-2-like rows: a group's shared head, then different continuations of unequal length.
    rows = [first, first, (*first, 28, 29, 30), (*first, 31), second, (*second, 32, 33)]
    ids, mask, cache = prefill_inputs(smollm2_model_f64, rows, smollm2_tokenizer.pad_token_id)
    assert cache is not None, "these rows share long prefixes: the test must exercise sharing"
    assert cache.get_seq_length() < ids.shape[1]
    for row, prompt_ids in enumerate(rows):
        assert ids[row][mask[row].bool()].tolist() == list(prompt_ids)

    def sample(batch_size: int):
        greedy = Decoding(temperature=0.0, max_new_tokens=12, batch_size=batch_size)
        return generate_from_ids(smollm2_model_f64, smollm2_tokenizer, rows, greedy)

    shared, alone = sample(len(rows)), sample(1)
    for a, b in zip(shared, alone, strict=True):
        assert a.token_ids == b.token_ids
        torch.testing.assert_close(*(torch.tensor(r.logprobs, dtype=torch.float64) for r in (a, b)), **F64)


def _row_cache(tokens: tuple[int, ...], pads_inside: int = 0) -> RowCache:
    """A 2-layer cache of `tokens` with `pads_inside` masked columns after the first token; the keys
    and values hold each column's id, so where a column lands can be read back."""
    ids = torch.tensor([tokens[0], *[0] * pads_inside, *tokens[1:]])
    mask = (torch.arange(len(ids)) == 0) | (torch.arange(len(ids)) > pads_inside)
    kv = ids.float().view(1, -1, 1).expand(1, -1, 2)
    return RowCache(ids, mask.long(), ((kv, -kv), (kv + 100, -kv - 100)))


def test_resumed_rows_read_only_what_follows_their_own_cache():
    from transformers import LlamaConfig

    model = SimpleNamespace(config=LlamaConfig(num_hidden_layers=2))
    caches = [_row_cache((1, 2, 3)), _row_cache((4, 5), pads_inside=2)]
    prompts = [(1, 2, 3, 7), (4, 5, 8, 9)]
    resumed = resume_inputs(model, prompts, caches, pad_id=0)
    assert resumed is not None
    ids, mask, cache = resumed
    # [pad | cache | pad | rest]: the caches are 3 and 4 columns wide, the rests 1 and 2.
    assert ids.tolist() == [[0, 1, 2, 3, 0, 7], [4, 0, 0, 5, 8, 9]]
    assert mask.tolist() == [[0, 1, 1, 1, 0, 1], [1, 0, 0, 1, 1, 1]]
    assert cache.get_seq_length() == 4
    assert cache.layers[0].keys[:, 0, :, 0].tolist() == [[0, 1, 2, 3], [4, 0, 0, 5]]
    assert cache.layers[1].values[:, 0, :, 0].tolist() == [[0, -101, -102, -103], [-104, -100, -100, -105]]
    for row, prompt in enumerate(prompts):
        assert ids[row][mask[row].bool()].tolist() == list(prompt)


def test_no_resuming_unless_every_prompt_goes_on_from_its_cache():
    from transformers import LlamaConfig

    model = SimpleNamespace(config=LlamaConfig(num_hidden_layers=2))
    cache = _row_cache((1, 2))
    assert resume_inputs(model, [(1, 2, 3), (1, 2, 4)], [cache, None], 0) is None  # a row without one
    assert resume_inputs(model, [(1, 5, 3)], [cache], 0) is None  # another episode
    assert resume_inputs(model, [(1, 2)], [cache], 0) is None  # nothing left to read for the first logits
    assert resume_inputs(model, [(1, 2, 3)], [cache], 0) is not None


@pytest.mark.slow
@pytest.mark.float_paths
@pytest.mark.parametrize("architecture", ["smollm2", "qwen3_5"])
def test_a_turn_resumed_from_the_kept_caches_equals_one_read_from_scratch(
    smollm2_model_f64, smollm2_tokenizer, architecture, monkeypatch
):
    """SmolLM2's keys and values, and a random Qwen3.5's Gated DeltaNet states beside its keys and
    values: the rows' new tokens differ in length, so the hybrid reads them in several passes."""
    from emoji_rl.decode.generate import Decoding, generate_from_ids
    from emoji_rl.lm.template import chat_ids

    tokenizer = smollm2_tokenizer
    # Two paths compared: float64 (tests/floats.py).
    if architecture == "smollm2":
        model = smollm2_model_f64
    else:
        model = float64(tiny_qwen3_5(vocab_size=len(tokenizer)).eval())

    def prompt(text: str) -> tuple[int, ...]:
        return tuple(chat_ids(tokenizer, [{"role": "user", "content": text}]))

    def sample(prompts, max_new_tokens=12, **options):
        greedy = Decoding(temperature=0.0, max_new_tokens=max_new_tokens)
        return generate_from_ids(model, tokenizer, prompts, greedy, **options)

    first = [prompt("I missed the train again"), prompt("I missed the train again"), prompt("Pizza tonight?")]
    # Keep a row that runs out of tokens too: its cache ends one token before its reply does.
    replies = sample(first, keep_caches=True) + sample(first[:1], keep_caches=True, max_new_tokens=3)
    assert not replies[-1].stopped and all(r.cache is not None for r in replies)
    feedback = [
        tuple(tokenizer(f"\nguess {i}:{' not' * (i % 3)} quite", add_special_tokens=False)["input_ids"])
        for i in range(4)
    ]
    assert len({len(f) for f in feedback}) == 3
    second = [(*p, *r.token_ids, *f) for p, r, f in zip([*first, first[0]], replies, feedback, strict=True)]
    resumes = []

    def spy(*args):
        resumes.append(resume_inputs(*args))
        return resumes[-1]

    monkeypatch.setattr("emoji_rl.decode.prefill.resume_inputs", spy)
    resumed = sample(second, caches=[r.cache for r in replies])
    assert len(resumes) == 1 and resumes[0] is not None  # it went on from the caches
    fresh = sample(second)
    for a, b in zip(resumed, fresh, strict=True):
        assert a.token_ids == b.token_ids
        want = torch.tensor(b.logprobs, dtype=torch.float64)
        # Qwen3.5's Gated DeltaNet reads the new tokens in several passes, in fp32 inside: fp32_inside.
        tolerance = F64 if architecture == "smollm2" else fp32_inside(model, want)
        torch.testing.assert_close(torch.tensor(a.logprobs, dtype=torch.float64), want, **tolerance)
