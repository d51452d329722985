from __future__ import annotations

import math

import pytest
import torch
from tests.floats import F64, float64, fp32_inside
from tests.tiny import tiny_llama, tiny_qwen3_5

from emoji_rl.decode.beam import Beam, beam_search, best_candidates, guide
from emoji_rl.decode.generate import Decoding, generate_from_ids
from emoji_rl.emoji.alphabet import parse_message
from emoji_rl.emoji.constraint import compile_emoji_grammar, replay_masks

INF = float("inf")


def _beam(score: float) -> Beam:
    return Beam(prompt=0, tokens=[], logprobs=[], score=score, matcher=None)  # type: ignore[arg-type]


def test_best_candidates_rank_whole_scores_and_set_aside_the_best_ending():
    # Two beams at -1 and -2 over 4 tokens, token 3 ends the message. Totals:
    #   beam 0: -1 + (-0.5, -1.0, -INF, -0.1) = -1.5, -2.0, -INF, -1.1
    #   beam 1: -2 + (-0.2, -3.0, -0.7, -2.0) = -2.2, -5.0, -2.7, -4.0
    # Best first: (0,3) -1.1 ends; (0,0) -1.5; (0,1) -2.0; (1,0) -2.2; (1,2) -2.7; ...
    beams = [_beam(-1.0), _beam(-2.0)]
    logprobs = torch.tensor([[-0.5, -1.0, -INF, -0.1], [-0.2, -3.0, -0.7, -2.0]])
    going, ended = best_candidates(beams, logprobs, width=3, ends=frozenset({3}))
    assert [(row, token) for row, token, _ in going] == [(0, 0), (0, 1), (1, 0)]
    assert [score for _, _, score in going] == pytest.approx([-1.5, -2.0, -2.2])
    assert ended is not None and ended[:2] == (0, 3) and ended[2] == pytest.approx(-1.1)


def test_best_candidates_never_take_a_forbidden_token():
    # One beam, only tokens 1 and 2 allowed: a width of 4 finds two.
    going, ended = best_candidates([_beam(0.0)], torch.tensor([[-INF, -0.3, -1.4, -INF]]), 4, frozenset({0}))
    assert [(row, token) for row, token, _ in going] == [(0, 1), (0, 2)]
    assert ended is None


def _block_model(tokenizer, bias: dict[str, float]):
    """A real Llama whose next-token logits are `bias` (by token text, 0 elsewhere) whatever came before."""
    model = tiny_llama(vocab_size=len(tokenizer)).eval()
    model.lm_head.weight.data.zero_()
    logits = torch.zeros(len(tokenizer))
    for token, value in bias.items():
        logits[tokenizer.convert_tokens_to_ids(token)] = value
    model.lm_head.register_forward_hook(lambda module, inputs, output: output + logits)
    return model


def test_beam_search_finds_the_likeliest_emoji_where_greedy_takes_the_likeliest_block(smollm2_tokenizer):
    """SmolLM2 writes most emoji as 'ðŁ' (bytes F0 9F), a block byte, then a code-point byte. The
    grammar allows 35 tokens after 'ðŁ'; block 'ĳ' (byte 91: U+1F440..7F, 👀 ... 👉 ...) holds 64
    emoji, block 'ĥ' (byte 83: U+1F0C0..FF) one, 🃏. With 'ĳ' at +3, 'ĥ' at +2 and every other token
    at 0: p('ĳ') = e^3 / Z and p('ĥ') = e^2 / Z with Z = e^3 + e^2 + 33, and 🃏 keeps all of its
    block's share where a 'ĳ' emoji gets about a 64th of its own: greedy decoding takes the block,
    beam search the emoji. 'ðŁ' at +5 and end of turn at +8 make both write two emoji."""
    tokenizer = smollm2_tokenizer
    block_91, block_83 = tokenizer.convert_tokens_to_ids(["ĳ", "ĥ"])
    model = _block_model(tokenizer, {"ðŁ": 5.0, "ĳ": 3.0, "ĥ": 2.0, "<|im_end|>": 8.0})
    prompts = [[1, 2, 3]]
    greedy = generate_from_ids(model, tokenizer, prompts, Decoding(temperature=0.0))[0]
    beam = beam_search(model, tokenizer, prompts, Decoding(temperature=0.0, num_beams=4))[0]
    # 👑 is F0 9F 91 91: the favoured byte picks its block and, within it, its code point.
    assert greedy.text == "👑👑" and greedy.token_ids[1] == block_91
    assert beam.text == "🃏🃏" and beam.stopped and beam.token_ids[1] == block_83
    z = math.exp(3) + math.exp(2) + 33
    for logprob in (greedy.logprobs[1], beam.logprobs[1] + 1):  # the block byte, by hand
        assert logprob == pytest.approx(3 - math.log(z), abs=1e-4)
    assert beam.logprobs[2] == pytest.approx(0.0, abs=1e-6)  # 🃏 is its block's only code point
    assert sum(beam.logprobs) > sum(greedy.logprobs)  # the more probable message, by 0.99 here


@pytest.mark.float_paths
@pytest.mark.parametrize("architecture", ["llama", "qwen3_5"])
def test_beam_replies_are_messages_scored_as_the_trainer_scores_them(smollm2_tokenizer, architecture):
    """On a random model, every beam keeps its own context through the cache's reordering (full
    attention, and Qwen3.5's Gated DeltaNet state too): the reply's log-probs are what a forward pass
    over prompt + reply gives under the replayed grammar.
    With one beam, the search can only end better than greedy decoding (it also keeps the best
    message that ended on the way)."""
    tokenizer = smollm2_tokenizer
    # The search's cache against one forward pass: two paths, in float64 (tests/floats.py).
    if architecture == "llama":
        model = float64(tiny_llama(vocab_size=len(tokenizer)).eval())
    else:
        model = float64(tiny_qwen3_5(vocab_size=len(tokenizer)).eval())
    constraint = compile_emoji_grammar(tokenizer, 2, 8, vocab_size=len(tokenizer))
    prompts = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14, 15, 16, 17]]
    budget = constraint.max_new_tokens  # enough for 8 emoji, after which the grammar allows only the end
    search = Decoding(temperature=0.0, max_new_tokens=budget, batch_size=6, num_beams=3)
    replies = beam_search(model, tokenizer, prompts, search)
    for prompt, reply in zip(prompts, replies, strict=True):
        assert reply.stopped and parse_message(reply.text).ok, reply.text
        ids = torch.tensor([[*prompt, *reply.token_ids]])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1]
        logits = logits.masked_fill(~replay_masks(constraint, reply.token_ids), -INF)
        want = logits.log_softmax(-1).gather(-1, torch.tensor(reply.token_ids)[:, None]).squeeze(1)
        # Qwen3.5's Gated DeltaNet steps one token at a time in fp32 inside, the pass chunks them.
        tolerance = F64 if architecture == "llama" else fp32_inside(model, want)
        torch.testing.assert_close(torch.tensor(reply.logprobs, dtype=torch.float64), want, **tolerance)
    greedy = generate_from_ids(model, tokenizer, prompts, Decoding(temperature=0.0, max_new_tokens=budget))
    one = beam_search(model, tokenizer, prompts, Decoding(temperature=0.0, max_new_tokens=budget))
    for g, b in zip(greedy, one, strict=True):
        assert sum(b.logprobs) >= sum(g.logprobs) - 1e-5


def test_guidance_scales_the_difference_between_conditional_and_unconditional_log_probs():
    # Masked log-probs c = log(1/2, 1/2, 0) and u = log(3/4, 1/4, 0) at scale 2: u + 2 (c - u) =
    # 2c - u = log(1/4 / (3/4)), log(1/4 / (1/4)) = log(1/3), log(1), renormalized to 1/4 and 3/4.
    c = torch.tensor([[math.log(0.5), math.log(0.5), -INF]])
    u = torch.tensor([[math.log(0.75), math.log(0.25), -INF]])
    guided = guide(c, u, 2.0)
    assert guided.exp().tolist()[0] == pytest.approx([0.25, 0.75, 0.0])
    assert torch.allclose(guide(c, u, 1.0), c)  # scale 1: the conditional distribution itself


@pytest.mark.float_paths
@pytest.mark.parametrize("num_beams", [1, 3])
def test_guided_search_scores_each_token_from_both_prompts(smollm2_tokenizer, num_beams):
    """Every beam's twin row reads the unconditional prompt and the beam's own tokens, through the
    cache's reordering: each reply's log-probs are `guide` of what forward passes over prompt + reply
    and unconditional + reply give under the replayed grammar."""
    tokenizer = smollm2_tokenizer
    model = float64(tiny_llama(vocab_size=len(tokenizer)).eval())  # two paths: tests/floats.py
    constraint = compile_emoji_grammar(tokenizer, 2, 8, vocab_size=len(tokenizer))
    prompts, unconditional = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14]], [5, 6, 20]
    search = Decoding(
        temperature=0.0,
        max_new_tokens=constraint.max_new_tokens,
        batch_size=6,
        num_beams=num_beams,
        guidance_scale=2.5,
    )
    replies = beam_search(model, tokenizer, prompts, search, unconditional)

    def masked(prompt, reply):
        ids = torch.tensor([[*prompt, *reply.token_ids]])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1]
        return logits.masked_fill(~replay_masks(constraint, reply.token_ids), -INF).log_softmax(-1)

    for prompt, reply in zip(prompts, replies, strict=True):
        assert reply.stopped and parse_message(reply.text).ok, reply.text
        want = guide(masked(prompt, reply), masked(unconditional, reply), 2.5)
        want = want.gather(-1, torch.tensor(reply.token_ids)[:, None]).squeeze(1)
        torch.testing.assert_close(torch.tensor(reply.logprobs, dtype=torch.float64), want, **F64)
    with pytest.raises(ValueError, match="unconditional"):
        beam_search(model, tokenizer, prompts, Decoding(temperature=0.0, guidance_scale=2.0))
