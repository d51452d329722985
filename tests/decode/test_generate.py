from __future__ import annotations

import math

import pytest
import torch
from tests.floats import FP32_EPS, float64, fp32_inside

from emoji_rl.decode.generate import Decoding, decode, ids_containing, sample_tokens
from emoji_rl.decode.prefill import Prefilled, left_pad

INF = float("inf")


def test_sampling_draws_only_allowed_tokens_even_at_the_ends_of_the_uniform(monkeypatch):
    # Allowed ids 1 and 3 with probabilities 1/4 and 3/4. u = (1 - rand) x total: rand = 0 puts u at
    # the very top (id 3, the last allowed), rand just below 1 puts it just above 0 (id 1, the first
    # allowed): an id whose cumulative sum merely equals u's neighbour, such as the masked id 0 or 4,
    # must never come out.
    scores = torch.tensor([[-INF, 0.0, -INF, math.log(3), -INF]])
    for rand, expected in ((0.0, 3), (1 - 2**-24, 1)):
        monkeypatch.setattr(torch, "rand", lambda *shape, r=rand, **options: torch.full(shape, r, **options))
        ids, logprobs = sample_tokens(scores, temperature=1.0)
        assert ids.tolist() == [expected]
        assert logprobs.item() == pytest.approx(math.log({1: 0.25, 3: 0.75}[expected]))


def test_sampling_follows_the_tempered_distribution():
    # Scores (0, 2 ln 2, 2 ln 3) at temperature 2 are the probabilities 1 : 2 : 3, i.e. 1/6, 2/6, 3/6.
    torch.manual_seed(0)
    scores = torch.tensor([[0.0, 2 * math.log(2), 2 * math.log(3), -INF]]).expand(20000, 4)
    ids, logprobs = sample_tokens(scores, temperature=2.0)
    share = torch.bincount(ids, minlength=4).float() / len(ids)
    assert share.tolist() == pytest.approx([1 / 6, 2 / 6, 3 / 6, 0.0], abs=0.01)
    assert logprobs[ids == 2].unique().tolist() == pytest.approx([math.log(0.5)])


def test_a_masked_id_is_never_drawn_whatever_the_rounding_of_the_cumulative_sum(monkeypatch):
    # CUDA sums in a tree, not left to right, so the sum at a masked id (probability 0) can round
    # above its predecessor's and catch a uniform. Plant that rounding in every float cumulative sum,
    # widened from 1 ulp to 0.05 so that draws find it; an integer sum is exact in any order.
    cumsum = torch.Tensor.cumsum

    def rounded_up_at_zeros(values, dim, **options):
        sums = cumsum(values, dim, **options)
        if not sums.is_floating_point():
            return sums
        return torch.where(values == 0, sums + 0.05, sums)

    monkeypatch.setattr(torch.Tensor, "cumsum", rounded_up_at_zeros)
    torch.manual_seed(0)
    # Masked ids first, between the allowed ones and last.
    scores = torch.tensor([[-INF, 0.0, -INF, 0.0, -INF, 0.0, -INF]]).expand(4000, 7)
    ids, logprobs = sample_tokens(scores, temperature=1.0)
    assert set(ids.tolist()) == {1, 3, 5}
    assert logprobs.tolist() == pytest.approx([-math.log(3)] * 4000)


def test_draw_frequencies_match_the_probabilities():
    # Masked ids at both ends and between, and a rare id: a chi-square test of 20,000 draws against
    # the probabilities (3 degrees of freedom; 16.27 is the 0.1% critical value).
    probabilities = torch.tensor([0.0, 0.02, 0.0, 0.18, 0.3, 0.0, 0.5, 0.0])
    scores = probabilities.log()[None].expand(20000, -1)
    torch.manual_seed(0)
    ids, _ = sample_tokens(scores, temperature=1.0)
    counts = torch.bincount(ids, minlength=len(probabilities)).double()
    assert counts[probabilities == 0].sum() == 0
    expected = probabilities[probabilities > 0].double() * len(ids)
    chi_square = ((counts[probabilities > 0] - expected) ** 2 / expected).sum().item()
    assert chi_square < 16.27, (counts.tolist(), chi_square)


def test_greedy_takes_the_argmax_with_its_log_prob():
    scores = torch.tensor([[1.0, 3.0, -INF], [0.0, 0.0, 5.0]])
    ids, logprobs = sample_tokens(scores, temperature=0.0)
    assert ids.tolist() == [1, 2]
    assert logprobs[0].item() == pytest.approx(3.0 - math.log(math.exp(1.0) + math.exp(3.0)))


def _tiny(config_name: str):
    import transformers

    config = getattr(transformers, config_name)(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
    )
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config).eval()


@pytest.mark.float_paths
@pytest.mark.parametrize("config_name", ["LlamaConfig", "Qwen3_5TextConfig"])
def test_rows_that_stop_leave_the_batch_without_changing_any_row(config_name):
    """Greedy decoding equals HF `generate`'s, token for token and log-prob for log-prob, while rows
    stop at different steps and leave the KV cache: full attention (Llama) and Qwen3.5's mix of Gated
    DeltaNet and attention layers, whose recurrent state is cut to the live rows too. Both hand back
    each row's cache as it stopped."""
    model = float64(_tiny(config_name))  # two decoders compared (tests/floats.py)
    prompts = [(5, 6, 7, 8, 9), (10, 11), (12, 13, 14, 15), (16, 17, 18)]
    ids, mask = left_pad(prompts, pad_id=0)
    with torch.no_grad():
        free = model.generate(
            input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=8, pad_token_id=0
        )
    # Stop at a token some row writes early and another row never writes, so rows end apart.
    written = [row[ids.shape[1] :].tolist() for row in free]
    stop_id = next(t for t in written[0][:4] if any(t not in w for w in written[1:]))
    with torch.no_grad():
        reference = model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=False,
            max_new_tokens=8,
            pad_token_id=0,
            eos_token_id=stop_id,
            output_scores=True,
            return_dict_in_generate=True,
        )
    steps = torch.stack(reference.scores, dim=1).log_softmax(-1)
    rows = decode(model, Prefilled(ids, mask, None), None, 0.0, 8, [stop_id], pad_id=0, keep_caches=True)
    lengths = {len(tokens) for tokens, _, _ in rows}
    assert len(lengths) > 1, "the rows must stop at different steps for the test to mean anything"
    for i, (tokens, logprobs, cache) in enumerate(rows):
        # Every token of the row but the last one sampled, which was never read.
        assert cache is not None and cache.tokens() == (*prompts[i], *tokens[:-1])
        expected = reference.sequences[i, ids.shape[1] :].tolist()
        expected = expected[: expected.index(stop_id) + 1] if stop_id in expected else expected
        assert tokens == expected
        want = steps[i, torch.arange(len(tokens)), torch.tensor(tokens)]
        # `generate` hands its scores out in fp32 whatever the model: the oracle rounds each logit
        # (1 ulp) and its log-softmax over the 64 ids (log2(64) ulps more). Qwen3.5's Gated DeltaNet
        # also steps in fp32 inside, on other rows than generate's (fp32_inside).
        tolerance = (1 + math.log2(64)) * FP32_EPS * float(want.abs().max())
        if config_name != "LlamaConfig":
            tolerance += fp32_inside(model, want)["atol"]
        torch.testing.assert_close(
            torch.tensor(logprobs, dtype=torch.float64), want.double(), atol=tolerance, rtol=0.0
        )


def test_a_decoding_that_searches_is_greedy_under_the_grammar_and_is_not_sampled(smollm2_tokenizer):
    """Beam search and guidance look for the best emoji message: a `Decoding` that asks for either with
    sampling or without the grammar is refused where it is made, and sampling refuses a search."""
    from emoji_rl.decode.beam import beam_search
    from emoji_rl.decode.generate import generate_from_ids

    for bad in (dict(num_beams=4), dict(constraint="none", temperature=0.0, guidance_scale=2.0)):
        with pytest.raises(ValueError, match="grammar constraint and temperature 0"):
            Decoding(**bad)
    for bad in (dict(batch_size=0), dict(num_beams=0), dict(max_new_tokens=-1)):
        with pytest.raises(ValueError, match="must be >= 1"):
            Decoding(**bad)
    search = Decoding(temperature=0.0, num_beams=4)
    assert search.searches and not Decoding(temperature=0.0).searches
    with pytest.raises(ValueError, match="a search, not sampling"):
        generate_from_ids(None, smollm2_tokenizer, [[1, 2]], search)
    with pytest.raises(ValueError, match="grammar at temperature 0"):
        beam_search(None, smollm2_tokenizer, [[1, 2]], Decoding("none", temperature=0.0))


def test_ids_containing_finds_every_token_that_writes_a_character(smollm2_tokenizer):
    ends = ids_containing(smollm2_tokenizer, ".!?\n")
    for text in (".", "!", "?", "\n", "..."):
        (token,) = smollm2_tokenizer(text, add_special_tokens=False)["input_ids"]
        assert token in ends, text
    pizza = smollm2_tokenizer(" pizza", add_special_tokens=False)["input_ids"]
    assert not ends & set(pizza)


@pytest.mark.slow
def test_a_reply_ends_at_its_first_sentence_end_and_keeps_its_text(smollm2_model, smollm2_tokenizer):
    from emoji_rl.decode.generate import generate_from_ids
    from emoji_rl.lm.template import chat_ids, stop_token_id

    ends = ids_containing(smollm2_tokenizer, ".!?\n")
    asks = ["Tell me about pizza in three sentences.", "Describe a beach.", "What is a cat?"]
    prompts = [chat_ids(smollm2_tokenizer, [{"role": "user", "content": ask}]) for ask in asks]
    decoding = Decoding("none", temperature=0.0, max_new_tokens=40, stop_ids=ends)
    replies = generate_from_ids(smollm2_model, smollm2_tokenizer, prompts, decoding)
    assert any(reply.token_ids[-1] in ends for reply in replies), "no reply ended a sentence: a weak test"
    for reply in replies:
        assert not ends & set(reply.token_ids[:-1])
        assert reply.stopped == (reply.token_ids[-1] in ends | {stop_token_id(smollm2_tokenizer)})
        if reply.token_ids[-1] in ends:  # unlike end of turn, the stop token's text is the reply's end
            assert reply.text == smollm2_tokenizer.decode(reply.token_ids)
            assert any(c in reply.text for c in ".!?\n")


@pytest.mark.parametrize("constraint", ["none", "static"])
def test_sampling_without_the_grammar_never_draws_a_padding_id(padded_qwen3_5, constraint):
    from emoji_rl.decode.generate import generate_from_ids

    model, tokenizer = padded_qwen3_5
    prompts = [tokenizer.encode("Guess the word"), tokenizer.encode("Hello")]
    with torch.no_grad():
        logits = model(torch.tensor([prompts[1]])).logits[0, -1]
    assert logits.argmax() >= len(tokenizer)  # unmasked, a padding id would win
    replies = generate_from_ids(model, tokenizer, prompts * 4, Decoding(constraint, max_new_tokens=4), seed=0)
    sampled = [i for reply in replies for i in reply.token_ids]
    assert len(sampled) >= len(replies) and max(sampled) < len(tokenizer)
    assert all(math.isfinite(p) for reply in replies for p in reply.logprobs)
