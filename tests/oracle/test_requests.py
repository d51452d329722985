"""Every body emoji_rl's vLLM clients send, as vLLM 0.33's own request classes read it: valid, with
no field vLLM would ignore (its classes accept unknown fields silently), and turned into the
SamplingParams the rollout engine relies on by vLLM's own conversion."""

from __future__ import annotations

import pytest

from emoji_rl.decode.generate import Decoding
from emoji_rl.decode.vllm import PADDING_BIAS, VLLMSampler
from emoji_rl.emoji.constraint import grammar_ebnf
from emoji_rl.io.endpoint import Endpoint

KINDS = {
    "/v1/completions": "completion",
    "/v1/chat/completions": "chat",
    "/v1/load_lora_adapter": "load_lora",
    "/v1/unload_lora_adapter": "unload_lora",
}


@pytest.fixture(scope="module")
def checked(traffic, vllm_oracle):
    sent = [x for x in traffic if x.source == "ours" and x.path in KINDS]
    items = [{"kind": KINDS[x.path], "body": x.body} for x in sent]
    return list(zip(items, vllm_oracle("requests", items=items), strict=True))


def test_our_clients_send_every_kind_of_request(checked):
    kinds = [item["kind"] for item, _ in checked]
    assert {k: kinds.count(k) for k in KINDS.values()} == {
        # verify's two log-probs probes, an emoji rollout batch of two prompts (a request each), and
        # a free-text one of one prompt
        "completion": 5,
        "chat": 2,
        "load_lora": 2,
        "unload_lora": 2,  # the version keep=1 retires, then the last, cleared at the end
    }


def test_every_body_validates_with_no_field_vllm_ignores(checked):
    wrong = [
        (item, answer["error"] or answer["unknown"])
        for item, answer in checked
        if answer["error"] or answer["unknown"]
    ]
    assert not wrong, wrong


def test_the_rollout_request_becomes_the_sampling_vllm_is_meant_to_run(checked):
    rollouts = [(i, a) for i, a in checked if i["kind"] == "completion" and "structured_outputs" in i["body"]]
    assert len(rollouts) == 2
    for item, answer in rollouts:
        sampling = answer["sampling"]
        assert sampling["structured_output_key"] == ["StructuredOutputOptions.GRAMMAR", grammar_ebnf()]
        assert (sampling["temperature"], sampling["logprobs"]) == (0.7, 0)
        neutral = ("top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty")
        assert [sampling[k] for k in neutral] == [1.0, 0, 0.0, 0.0, 0.0, 1.0]
        assert sampling["stop_token_ids"] == item["body"]["stop_token_ids"]
        assert sampling["max_tokens"] == item["body"]["max_tokens"]
        # The request's own seed is the one vLLM samples with: its samples are a function of it.
        assert sampling["seed"] == item["body"]["seed"]
    assert len({answer["sampling"]["seed"] for _, answer in rollouts}) == 2


def test_a_free_text_rollout_is_the_same_sampling_with_no_grammar(checked):
    """Wordle on the vllm engine: vLLM samples unconstrained, stopping on our stop ids, as the
    trainer scores it (no logit mask for a free-text game); only the seed, a request's own, differs."""
    rollouts = [
        a["sampling"] for i, a in checked if i["kind"] == "completion" and i["body"].get("logprobs") == 0
    ]
    emoji = next(s for s in rollouts if s["structured_output_key"] is not None)
    [free] = [s for s in rollouts if s["structured_output_key"] is None]
    assert {**free, "structured_output_key": emoji["structured_output_key"], "seed": emoji["seed"]} == emoji


def test_a_free_text_rollout_on_a_padded_head_biases_exactly_the_padding_ids_off(vllm_oracle):
    """Qwen3.5: 248,077 token ids, 248,320 logits. Without the grammar the request gives each padding
    id vLLM's lowest bias, as vLLM reads it and checks it against the model's width; with the grammar,
    which allows none of them, nothing is added."""
    tokens, width = 248077, 248320
    bodies = [
        VLLMSampler(
            Endpoint("http://127.0.0.1:9"),
            "policy",
            248046,
            Decoding(constraint),
            padding=range(tokens, width),
        ).request_body([1, 2, 3], 7)
        for constraint in ("none", "grammar")
    ]
    items = [{"kind": "completion", "body": body} for body in bodies]
    free, emoji = vllm_oracle("requests", items=items, vocab_size=width)
    assert (free["error"], free["unknown"], emoji["error"], emoji["unknown"]) == (None, [], None, [])
    assert free["sampling"]["logit_bias"] == [[i, PADDING_BIAS] for i in range(tokens, width)]
    assert PADDING_BIAS == -100.0  # vLLM's floor: a lower bias is clamped to it
    assert emoji["sampling"]["logit_bias"] is None and "logit_bias" not in bodies[1]


def test_the_oracle_sees_a_field_vllm_would_ignore(vllm_oracle):
    """The check above could fail: vLLM >= 0.12 silently drops the old `guided_grammar` field."""
    body = {
        "model": "policy",
        "prompt": [[1]],
        "guided_grammar": 'root ::= "a"',
        "structured_outputs": {"grammar": 'root ::= "a"', "regexp": "a"},
    }
    [answer] = vllm_oracle("requests", items=[{"kind": "completion", "body": body}])
    assert answer["unknown"] == ["guided_grammar", "structured_outputs.regexp"]
