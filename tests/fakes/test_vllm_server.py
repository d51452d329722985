"""The fake vLLM server checks what vLLM 0.33 checks and answers as it does (docs/VLLM.md §8)."""

from __future__ import annotations

import json
import math
import socket

import httpx
import pytest
import torch
from tests.fakes.fake_lm import FakeLM, SamplingParams
from tests.fakes.vllm_server import FakeVLLMServer
from tests.floats import FP32_EPS

from emoji_rl.emoji.alphabet import parse_message
from emoji_rl.emoji.constraint import (
    compile_emoji_grammar,
    grammar_ebnf,
    replay_masks,
    vllm_structured_outputs,
)
from emoji_rl.io.endpoint import wait_for_server
from emoji_rl.lm.template import stop_token_id
from emoji_rl.rl import grpo

GRAMMAR = vllm_structured_outputs(2, 8)


@pytest.fixture(scope="module")
def lm(smollm2_tokenizer):
    return FakeLM(smollm2_tokenizer)


@pytest.fixture
def server(lm):
    with FakeVLLMServer(lm, max_model_len=512) as fake:
        yield fake


def post(server, path, body, headers=None):
    return httpx.post(server.url + path, json=body, headers=server.auth if headers is None else headers)


def assert_error(response, status, param=None):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == status and set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param, error
    return error["message"]


def completion(server, **fields):
    body = {"model": "policy", "prompt": [[1, 2, 3]], "max_tokens": 64, **fields}
    response = post(server, "/v1/completions", body)
    assert response.status_code == 200, response.text
    return response.json()


# --- auth, routes, readiness -----------------------------------------------------------------------


def test_health_needs_no_key_and_v1_paths_do(server):
    health = httpx.get(server.url + "/health")
    assert health.status_code == 200 and health.content == b""
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        refused = httpx.get(server.url + "/v1/models", headers=headers)
        assert refused.status_code == 401 and refused.json() == {"error": "Unauthorized"}
    assert httpx.get(server.url + "/v1/models", headers=server.auth).status_code == 200


def test_unknown_route_and_non_json_body(server):
    missing = httpx.get(server.url + "/v1/nothing", headers=server.auth)
    assert missing.status_code == 404 and missing.json() == {"detail": "Not Found"}
    form = httpx.post(
        server.url + "/v1/completions",
        content=b"prompt=1",
        headers={**server.auth, "Content-Type": "text/plain"},
    )
    assert_error(form, 400)


def test_connections_are_refused_until_ready(lm):
    with FakeVLLMServer(lm, ready_after=0.5) as fake:
        with pytest.raises(httpx.ConnectError):
            httpx.get(fake.url + "/health")
        wait_for_server(fake.url, timeout_s=10, poll_s=0.05)
        assert httpx.get(fake.url + "/health").status_code == 200


def test_a_server_that_never_gets_ready_refuses_connections(lm):
    with FakeVLLMServer(lm, ready_after=None) as fake, pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", int(fake.url.rsplit(":", 1)[1])), timeout=1)


# --- completions: answers ----------------------------------------------------------------------------


def test_batch_answer_has_every_key_and_choices_ordered_by_prompt_then_sample(server, smollm2_tokenizer):
    stop = stop_token_id(smollm2_tokenizer)
    prompts = [[1, 2, 3], [4, 5]]
    body = completion(
        server,
        prompt=prompts,
        n=2,
        logprobs=3,
        return_token_ids=True,
        stop_token_ids=[stop],
        structured_outputs=GRAMMAR,
    )
    assert set(body) == {
        "id", "object", "created", "model", "choices", "service_tier", "system_fingerprint", "usage",
        "kv_transfer_params", "ec_transfer_params", "metrics",
    }  # fmt: skip
    assert body["object"] == "text_completion" and body["model"] == "policy"
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    assert [c["prompt_token_ids"] for c in body["choices"]] == [
        prompts[0],
        prompts[0],
        prompts[1],
        prompts[1],
    ]
    for choice in body["choices"]:
        ids, lp = choice["token_ids"], choice["logprobs"]
        assert set(choice) == {
            "index", "text", "logprobs", "finish_reason", "stop_reason", "token_ids", "prompt_logprobs",
            "prompt_token_ids", "routed_experts", "weight_versions",
        }  # fmt: skip
        assert (
            len(ids)
            == len(lp["tokens"])
            == len(lp["token_logprobs"])
            == len(lp["top_logprobs"])
            == len(lp["text_offset"])
        )
        assert all(-9999 <= v <= 0 for v in lp["token_logprobs"])
        assert all(len(top) <= 4 and all(-9999 <= v <= 0 for v in top.values()) for top in lp["top_logprobs"])
        # EOS ends the turn: kept in token_ids, absent from text; stopping on it leaves stop_reason null.
        assert ids[-1] == stop and choice["finish_reason"] == "stop" and choice["stop_reason"] is None
        assert choice["text"] == smollm2_tokenizer.decode(ids[:-1]) and parse_message(choice["text"], 2, 8).ok
    usage = body["usage"]
    assert usage["prompt_tokens"] == 5  # each prompt once, not n times
    assert usage["completion_tokens"] == sum(len(c["token_ids"]) for c in body["choices"])


def test_token_ids_only_with_return_token_ids_and_logprobs_only_when_asked(server):
    choice = completion(server)["choices"][0]
    assert choice["token_ids"] is None and choice["prompt_token_ids"] is None and choice["logprobs"] is None


def test_logprobs_zero_gives_only_the_sampled_token(server):
    choice = completion(server, logprobs=0, structured_outputs=GRAMMAR)["choices"][0]
    assert all(len(top) == 1 for top in choice["logprobs"]["top_logprobs"])


@pytest.mark.float_paths
@pytest.mark.parametrize(
    ("mode", "temperature"), [("raw_logprobs", 1.0), ("raw_logprobs", 0.5), ("processed_logprobs", 0.5)]
)
def test_logprobs_are_normalized_over_the_grammar_allowed_tokens(lm, smollm2_tokenizer, mode, temperature):
    stop = stop_token_id(smollm2_tokenizer)
    constraint = compile_emoji_grammar(smollm2_tokenizer, 2, 8, vocab_size=len(smollm2_tokenizer))
    with FakeVLLMServer(lm, logprobs_mode=mode) as fake:
        body = completion(
            fake,
            temperature=temperature,
            logprobs=0,
            return_token_ids=True,
            stop_token_ids=[stop],
            structured_outputs=GRAMMAR,
        )
    choice = body["choices"][0]
    ids = choice["token_ids"]
    context = [1, 2, 3, *ids]
    logits = torch.stack([lm.logits("base:policy", context[: 3 + t]) for t in range(len(ids))])
    allowed = replay_masks(constraint, ids)
    scale = temperature if mode == "processed_logprobs" else 1.0
    expected = grpo.masked_token_logprobs(logits[None], allowed[None], torch.tensor([ids]), scale)[0]
    # One fp32 log-softmax of the same logits on each side, summed in another order (the fake runs
    # one thread): at most log2(V) ulps of the largest value apart each (tests/floats.py).
    ulps = math.log2(logits.shape[-1]) * FP32_EPS * float(expected.abs().max())
    assert choice["logprobs"]["token_logprobs"] == pytest.approx(expected.tolist(), abs=2 * ulps)
    unconstrained = logits.log_softmax(-1).gather(-1, torch.tensor(ids)[:, None])[:, 0]
    assert (expected > unconstrained + 1e-3).any()  # the mask renormalizes: not the full-vocabulary value


def test_a_fixed_seed_repeats_and_gives_identical_prompts_identical_samples(server):
    first = completion(
        server, prompt=[[1, 2, 3], [1, 2, 3]], seed=7, return_token_ids=True, structured_outputs=GRAMMAR
    )
    again = completion(server, prompt=[[1, 2, 3]], seed=7, return_token_ids=True, structured_outputs=GRAMMAR)
    ids = [c["token_ids"] for c in first["choices"]]
    assert ids[0] == ids[1] == again["choices"][0]["token_ids"]


def test_a_lark_grammar_is_accepted_and_guided_fields_do_not_constrain(server):
    lark = completion(server, structured_outputs={"grammar": "start: 'yes' | 'no'"}, return_token_ids=True)
    assert lark["choices"][0]["text"] in {"yes", "no"}
    guided = completion(server, guided_grammar=grammar_ebnf(2, 8), max_tokens=40, seed=3)
    assert not parse_message(guided["choices"][0]["text"], 2, 8).ok


# --- completions: validation --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "status", "param"),
    [
        ({"prompt": [[1, -2]]}, 400, "body.prompt"),
        ({"prompt": [1, "a"]}, 400, "body.prompt.1"),
        ({"prompt": [-1]}, 400, "body.prompt.0"),
        ({"prompt": [[1, 49152]]}, 400, "prompt"),
        ({"prompt": [[1]] * 1025}, 400, "prompt"),
        ({"logprobs": 21}, 400, "logprobs"),
        ({"logprobs": "1"}, 400, "logprobs"),
        ({"logprobs": -1}, 400, "logprobs"),
        ({"structured_outputs": {}}, 400, None),
        ({"structured_outputs": {"grammar": 'root ::= "a"', "regex": "a"}}, 400, None),
        ({"structured_outputs": {"grammar": ""}}, 400, None),
        ({"structured_outputs": {"grammar": 'root ::= "a'}}, 400, None),
        ({"structured_outputs": {"grammar": "this is not a grammar"}}, 400, None),
        ({"model": "policy-v9"}, 404, "model"),
        ({"temperature": -1}, 400, "temperature"),
        ({"max_tokens": 0}, 400, "max_tokens"),
    ],
)
def test_invalid_requests_are_refused_like_vllm(server, fields, status, param):
    body = {"model": "policy", "prompt": [[1, 2, 3]], "max_tokens": 8, **fields}
    assert_error(post(server, "/v1/completions", body), status, param)


def test_unknown_model_lists_valid_aliases(server):
    message = assert_error(post(server, "/v1/completions", {"model": "x", "prompt": [1]}), 404, "model")
    assert message == "The model `x` does not exist. Valid aliases: policy."


def test_length_rules_of_0_33_clamp_and_of_0_22_refuse(lm):
    prompt = list(range(1, 501))
    with FakeVLLMServer(lm, max_model_len=512) as fake:
        assert_error(post(fake, "/v1/completions", {"prompt": list(range(1, 514))}), 400, "input_tokens")
        assert_error(post(fake, "/v1/completions", {"prompt": [1], "max_tokens": 513}), 400, "max_tokens")
        assert_error(post(fake, "/v1/completions", {"prompt": list(range(1, 513))}), 400, "max_tokens")
        clamped = completion(
            fake,
            prompt=prompt,
            max_tokens=100,
            return_token_ids=True,
            structured_outputs={"regex": "[0-9]{40}"},
        )
        choice = clamped["choices"][0]
        assert len(choice["token_ids"]) == 12 and choice["finish_reason"] == "length"
    with FakeVLLMServer(lm, max_model_len=512, length_rule="0.22") as old:
        assert_error(post(old, "/v1/completions", {"prompt": prompt, "max_tokens": 100}), 400, "input_tokens")


def test_every_request_is_recorded_with_its_exact_body(server):
    body = {"model": "policy", "prompt": [[5, 6]], "max_tokens": 2, "extra_field": {"kept": True}}
    post(server, "/v1/completions", body)
    [recorded] = server.requests
    assert (recorded.method, recorded.path, recorded.body) == ("POST", "/v1/completions", body)
    assert recorded.headers["authorization"] == "Bearer test-key"


# --- chat ----------------------------------------------------------------------------------------------


def test_chat_answer_shape_and_max_completion_tokens_beats_max_tokens(server):
    messages = [{"role": "user", "content": "Emoji: 🍕\nWhat was the message?"}]
    body = {
        "model": "policy",
        "messages": messages,
        "max_tokens": 100,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    full = post(server, "/v1/chat/completions", body).json()
    message = full["choices"][0]["message"]
    assert (
        isinstance(message["content"], str) and message["reasoning"] is None and "tool_calls" not in message
    )
    assert full["choices"][0]["finish_reason"] == "stop" and full["object"] == "chat.completion"
    cut = post(server, "/v1/chat/completions", {**body, "max_completion_tokens": 3}).json()
    assert cut["choices"][0]["finish_reason"] == "length" and cut["usage"]["completion_tokens"] == 3


@pytest.mark.parametrize("key", ["chat_template", "tokenize"])
def test_chat_template_kwargs_that_vllm_refuses(server, key):
    body = {"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {key: True}}
    assert_error(post(server, "/v1/chat/completions", body), 400, "chat_template_kwargs")


# --- LoRA ----------------------------------------------------------------------------------------------


def make_adapter(path, rank=8):
    path.mkdir(parents=True, exist_ok=True)
    (path / "adapter_config.json").write_text(json.dumps({"r": rank, "peft_type": "LORA"}))
    return str(path)


def test_lora_routes_do_not_exist_without_runtime_updating(lm, tmp_path):
    with FakeVLLMServer(lm, runtime_lora=False) as fake:
        body = {"lora_name": "a", "lora_path": make_adapter(tmp_path / "a")}
        refused = post(fake, "/v1/load_lora_adapter", body)
        assert refused.status_code == 404 and refused.json() == {"detail": "Not Found"}
        assert post(fake, "/v1/load_lora_adapter", body, headers={}).status_code == 401


def test_lora_load_use_and_unload(server, tmp_path):
    path = make_adapter(tmp_path / "v3")
    loaded = post(server, "/v1/load_lora_adapter", {"lora_name": "policy-v3", "lora_path": path})
    assert loaded.status_code == 200 and "content-type" not in loaded.headers
    assert loaded.text == "Success: LoRA adapter 'policy-v3' added successfully."
    cards = httpx.get(server.url + "/v1/models", headers=server.auth).json()["data"]
    assert [c["id"] for c in cards] == ["policy", "policy-v3"]
    assert (cards[1]["parent"], cards[1]["root"], cards[1]["max_model_len"]) == ("policy", path, None)
    base = completion(server, seed=1, logprobs=0)["choices"][0]["logprobs"]["token_logprobs"]
    adapted = completion(server, model="policy-v3", seed=1, logprobs=0)
    # The adapter's logits differ from the base model's; the sampled tokens may still coincide (the
    # fake keys its logits by the adapter's tmp path, new each run), their log-probs cannot.
    assert adapted["model"] == "policy-v3" and adapted["choices"][0]["logprobs"]["token_logprobs"] != base
    unloaded = post(server, "/v1/unload_lora_adapter", {"lora_name": "policy-v3"})
    assert unloaded.text == "Success: LoRA adapter 'policy-v3' removed successfully."
    assert_error(post(server, "/v1/completions", {"model": "policy-v3", "prompt": [1]}), 404, "model")
    assert_error(post(server, "/v1/unload_lora_adapter", {"lora_name": "policy-v3"}), 404)


def test_lora_load_errors(lm, tmp_path):
    with FakeVLLMServer(lm, max_lora_rank=16) as fake:
        path = make_adapter(tmp_path / "a")
        assert post(fake, "/v1/load_lora_adapter", {"lora_name": "a", "lora_path": path}).status_code == 200
        duplicate = assert_error(
            post(fake, "/v1/load_lora_adapter", {"lora_name": "a", "lora_path": path}), 400
        )
        assert "already been loaded" in duplicate
        inplace = {"lora_name": "a", "lora_path": path, "load_inplace": True}
        assert post(fake, "/v1/load_lora_adapter", inplace).status_code == 200
        assert_error(post(fake, "/v1/load_lora_adapter", {"lora_name": "policy", "lora_path": path}), 400)
        assert_error(post(fake, "/v1/load_lora_adapter", {"lora_name": "b", "lora_path": ""}), 400)
        assert_error(post(fake, "/v1/load_lora_adapter", {"lora_name": "b"}), 400, "body.lora_path")
        missing = assert_error(
            post(fake, "/v1/load_lora_adapter", {"lora_name": "b", "lora_path": "/tmp/none"}), 404
        )
        assert missing == "Loading lora b failed: No adapter found for <path>"
        big = make_adapter(tmp_path / "big", rank=64)
        too_big = assert_error(post(fake, "/v1/load_lora_adapter", {"lora_name": "b", "lora_path": big}), 500)
        assert "LoRA rank 64 is greater than max_lora_rank 16" in too_big


def test_injected_failures_answer_once_each(server):
    server.fail_next("/v1/completions", 503)
    assert post(server, "/v1/completions", {"prompt": [1], "max_tokens": 1}).status_code == 503
    assert post(server, "/v1/completions", {"prompt": [1], "max_tokens": 1}).status_code == 200


class PrefersEndOfText(FakeLM):
    """Puts <|endoftext|> (id 0) far ahead of every other token, EOS included."""

    def logits(self, model, context):
        logits = super().logits(model, context)
        logits[0] += 100.0
        return logits


def test_a_requests_stop_ids_may_end_a_grammar_as_vllms_override_stop_tokens_allow(smollm2_tokenizer):
    """vLLM 0.33 hands the request's stop ids (and the generation config's EOS ids) to xgrammar as
    override_stop_tokens: allowed once the grammar accepts, masked before."""
    lm = PrefersEndOfText(smollm2_tokenizer)
    params = SamplingParams(max_tokens=8, temperature=0, stop_token_ids=frozenset({0}))
    grammar = lm.compile("grammar", 'root ::= "ab"')
    generation = lm.generate("base:policy", [1, 2], params, grammar, torch.Generator())
    assert smollm2_tokenizer.decode(generation.token_ids[:-1]) == "ab"
    assert (generation.token_ids[-1], generation.finish_reason, generation.stop_reason) == (0, "stop", 0)
