"""The vllm rollout engine against the fake vLLM 0.33 server: exact requests, adapter versions,
retries, readiness, and retrieval-game turns played end to end."""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time

import httpx
import pytest
import torch
from tests.fakes.vllm_server import FakeVLLMServer
from tests.floats import FP32_EPS
from tests.rl.rollout.conftest import KEY_ENV, endpoint

from emoji_rl.decode.generate import Decoding
from emoji_rl.decode.sampler import Sample
from emoji_rl.decode.vllm import VLLMSampler, request_seed
from emoji_rl.emoji.constraint import compile_emoji_grammar, grammar_ebnf, replay_masks
from emoji_rl.emoji.sender_prompts import sender_messages
from emoji_rl.errors import UserError
from emoji_rl.games.retrieval.game import RetrievalBuilder, RetrievalRules
from emoji_rl.io.endpoint import Endpoint, wait_for_server
from emoji_rl.lm import template
from emoji_rl.play.judge import LexiconJudge
from emoji_rl.play.loop import play
from emoji_rl.rl import grpo
from emoji_rl.rl.rollout.vllm import AdapterSync


def sampler_for(server, tokenizer, constraint="grammar", temperature=1.0, **kwargs):
    decoding = Decoding(constraint, temperature, max_new_tokens=64)
    return VLLMSampler(endpoint(server), "policy", template.stop_token_id(tokenizer), decoding, **kwargs)


class WordOverlap:
    """Stands in for the MiniLM similarity (seconds to load): the game only needs a number per pair."""

    def similarity(self, targets, guesses):
        return [
            len(set(t.lower().split()) & set(g.lower().split())) / len(t.split())
            for t, g in zip(targets, guesses, strict=True)
        ]


def save_adapter(rank=8):
    def save(path):
        path.mkdir(parents=True)
        (path / "adapter_config.json").write_text(json.dumps({"r": rank, "peft_type": "LORA"}))
        (path / "adapter_model.safetensors").write_bytes(b"weights")

    return save


# --- requests and samples ----------------------------------------------------------------------------


def rollout_body(prompt, seed, **changes):
    """What the sampler of `sampler_for` sends for one prompt: every field, the seed included."""
    return {
        "model": "policy",
        "prompt": list(prompt),
        "max_tokens": 64,
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": 0,
        "min_p": 0.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "repetition_penalty": 1.0,
        "logprobs": 0,
        "return_token_ids": True,
        "stop_token_ids": [2],
        "seed": seed,
        "structured_outputs": {"grammar": grammar_ebnf(2, 8)},
        **changes,
    }


def test_each_prompt_is_one_request_with_every_field_and_its_seed(server, smollm2_tokenizer):
    sampler = sampler_for(server, smollm2_tokenizer, temperature=1.0, seed=11)
    prompts = [(1, 2, 3), (4, 5), (1, 2, 3)]
    samples = asyncio.run(sampler.sample(prompts))
    assert all(r.path == "/v1/completions" for r in server.requests)
    assert all(r.headers["authorization"] == "Bearer test-key" for r in server.requests)
    # Sent at once, they reach the server in any order.
    sent = sorted(server.bodies("/v1/completions"), key=lambda body: body["seed"])
    expected = [rollout_body(p, request_seed(11, 0, i)) for i, p in enumerate(prompts)]
    assert sent == sorted(expected, key=lambda body: body["seed"])
    assert len(samples) == 3
    for sample in samples:
        assert sample.token_ids[-1] == 2 and len(sample.logprobs) == len(sample.token_ids)
        assert all(lp <= 0 for lp in sample.logprobs)
        assert sample.version is None


def test_a_free_text_game_sends_no_grammar(server, smollm2_tokenizer):
    """Wordle's replies are not emoji: the request carries no `structured_outputs`, as the trainer
    masks no logits for it, and the rest of the body is the emoji game's."""
    emoji, free = (
        sampler_for(server, smollm2_tokenizer),
        sampler_for(server, smollm2_tokenizer, "none"),
    )
    body = free.request_body((1, 2, 3), 5)
    assert "structured_outputs" not in body
    assert body == {k: v for k, v in emoji.request_body((1, 2, 3), 5).items() if k != "structured_outputs"}
    [sample] = asyncio.run(free.sample([(1, 2, 3)]))
    assert "structured_outputs" not in server.requests[-1].body and sample.token_ids


def test_a_seat_samples_under_its_own_constraint_with_the_same_seeds(server, smollm2_tokenizer):
    """A game that seats the policy twice (docs/DESIGN.md §14) asks one sampler for its sender's turns
    under the grammar and its reader's in free text: each request is what a sampler set to that
    constraint sends, and the calls count on, so the two seats never share seeds."""
    emoji, free = (
        sampler_for(server, smollm2_tokenizer),
        sampler_for(server, smollm2_tokenizer, "none"),
    )
    assert emoji.request_body((1, 2, 3), 5, "none") == free.request_body((1, 2, 3), 5)
    assert free.request_body((1, 2, 3), 5, "grammar") == emoji.request_body((1, 2, 3), 5)
    asyncio.run(emoji.sample([(1, 2, 3)], constraint="none"))
    asyncio.run(emoji.sample([(1, 2, 3)]))
    first, second = server.bodies("/v1/completions")[-2:]
    assert "structured_outputs" not in first and "structured_outputs" in second
    assert first["seed"] != second["seed"]


FIRST = 10  # prompt i of the reversed server's call is (1, FIRST + i)


class AnswersInReverse(FakeVLLMServer):
    """Answers the rollout requests of one call last prompt first: each waits until the request of the
    prompt after it has been answered. Records (prompt, token ids) in the order it answered."""

    def __init__(self, lm, n_prompts, **kwargs):
        super().__init__(lm, **kwargs)
        self.answered = [threading.Event() for _ in range(n_prompts)]
        self.answers = []

    def dispatch(self, method, path, headers, raw):
        if path != "/v1/completions":
            return super().dispatch(method, path, headers, raw)
        prompt = json.loads(raw)["prompt"]
        i = prompt[-1] - FIRST
        if i + 1 < len(self.answered):
            self.answered[i + 1].wait(timeout=30)
        status, payload = super().dispatch(method, path, headers, raw)
        self.answers.append((tuple(prompt), tuple(payload["choices"][0]["token_ids"])))
        self.answered[i].set()
        return status, payload


def test_samples_come_back_in_prompt_order_when_answers_do_not(lm, smollm2_tokenizer, monkeypatch):
    monkeypatch.setenv(KEY_ENV, "test-key")
    prompts = [(1, FIRST + i) for i in range(4)]
    with AnswersInReverse(lm, len(prompts)) as reversing:
        samples = asyncio.run(sampler_for(reversing, smollm2_tokenizer).sample(prompts))
    assert [prompt for prompt, _ in reversing.answers] == prompts[::-1]
    answered = dict(reversing.answers)
    assert [s.token_ids for s in samples] == [answered[p] for p in prompts]


def test_samples_are_a_function_of_the_seed_the_call_and_the_row(server, smollm2_tokenizer):
    """Two copies bound with the same seed sample alike; identical prompts in one call (a group's
    first turns) do not, nor does another seed, nor the copy's next call."""
    base = sampler_for(server, smollm2_tokenizer, temperature=1.0)
    prompts = [(1, 2, 3)] * 4 + [(4, 5), (6, 7, 8)]

    def draw(sampler):
        return [(s.token_ids, s.logprobs) for s in asyncio.run(sampler.sample(prompts))]

    first = base.at(3, "policy", seed=7)
    once = draw(first)
    assert draw(base.at(3, "policy", seed=7)) == once
    assert len(set(once[:4])) == 4  # the four identical prompts: four different samples
    other = draw(base.at(3, "policy", seed=8))
    assert all(a != b for a, b in zip(other, once, strict=True))
    again = draw(first)  # the same copy's second call
    assert all(a != b for a, b in zip(again, once, strict=True))
    seeds = [body["seed"] for body in server.bodies("/v1/completions")]
    by_call = [set(seeds[k : k + len(prompts)]) for k in range(0, len(seeds), len(prompts))]
    n = len(prompts)
    assert by_call[0] == by_call[1] == {request_seed(7, 0, i) for i in range(n)}
    assert by_call[3] == {request_seed(7, 1, i) for i in range(n)}
    assert len(set().union(*by_call)) == 3 * n  # seed 7's two calls and seed 8's: no seed twice


def test_at_binds_a_copy_to_a_version_and_leaves_the_original(server, smollm2_tokenizer, tmp_path):
    base = sampler_for(server, smollm2_tokenizer, seed=5)
    sync = AdapterSync(base, tmp_path, "policy", session="1")
    older, newer = sync.publish(4, save_adapter()), sync.publish(5, save_adapter())
    asyncio.run(base.sample([(1, 2)]))  # the original's call 0
    bound = base.at(4, older, seed=9)
    samples = asyncio.run(bound.sample([(1, 2), (3, 4)]))
    assert [s.version for s in samples] == [4, 4]
    assert (base.model, base.version, base.seed) == (newer, None, 5)
    [unbound] = asyncio.run(base.sample([(1, 2)]))  # the original's call 1: the copy's calls are its own
    assert unbound.version is None
    sent = [(b["model"], b["seed"]) for b in server.bodies("/v1/completions")]
    assert sent[0] == (newer, request_seed(5, 0, 0)) and sent[-1] == (newer, request_seed(5, 1, 0))
    assert set(sent[1:3]) == {(older, request_seed(9, 0, 0)), (older, request_seed(9, 0, 1))}


def test_an_empty_call_sends_nothing_but_counts(server, smollm2_tokenizer):
    sampler = sampler_for(server, smollm2_tokenizer, seed=3)
    assert asyncio.run(sampler.sample([])) == [] and not server.requests
    asyncio.run(sampler.sample([(1, 2)]))
    assert server.bodies("/v1/completions")[0]["seed"] == request_seed(3, 1, 0)


def test_request_seeds_are_pinned_distinct_and_in_range():
    # These values pin the derivation: a change to it changes every run's samples, and must be seen.
    assert request_seed(0, 0, 0) == 3218101674565419774
    assert request_seed(1234, 5, 7) == 2510123244013290608
    assert request_seed(-1, 0, 3) == 2975999435544127493
    grid = [request_seed(seed, call, index) for seed in (0, 1) for call in range(20) for index in range(64)]
    assert len(set(grid)) == len(grid)
    assert all(0 <= s < 2**62 for s in grid)


def test_requests_in_flight_are_bounded(server, smollm2_tokenizer, monkeypatch):
    answer = server._completions

    def slow(body):  # each answer takes long enough for the next requests to queue up behind it
        time.sleep(0.05)
        return answer(body)

    monkeypatch.setattr(server, "_completions", slow)
    sampler = sampler_for(server, smollm2_tokenizer, max_concurrent_requests=3)
    assert len(asyncio.run(sampler.sample([(1, i) for i in range(3, 13)]))) == 10
    assert len(server.bodies("/v1/completions")) == 10
    assert server.max_in_flight == 3


def test_one_prompts_answer_is_checked(server, smollm2_tokenizer):
    sampler = sampler_for(server, smollm2_tokenizer)
    choice = {"index": 0, "token_ids": [10, 2], "logprobs": {"token_logprobs": [-0.5, -0.1]}}
    assert sampler._sample({"choices": [choice]}) == Sample((10, 2), (-0.5, -0.1))
    with pytest.raises(UserError, match="returned 2 choices for one prompt"):
        sampler._sample({"choices": [choice, {**choice, "index": 1}]})
    with pytest.raises(UserError, match="log-probs"):
        sampler._sample({"choices": [{**choice, "logprobs": {"token_logprobs": [-0.5]}}]})


def test_a_server_without_token_ids_is_refused(server, smollm2_tokenizer):
    sampler = sampler_for(server, smollm2_tokenizer)
    choice = {"index": 0, "token_ids": None, "logprobs": {"token_logprobs": [-0.1]}}
    with pytest.raises(UserError, match=r"vLLM >= 0\.10\.2"):
        sampler._sample({"choices": [choice]})


def test_what_the_server_cannot_sample_is_refused_where_the_sampler_is_made():
    here = Endpoint("http://127.0.0.1:9")
    for decoding in (
        Decoding("static"),
        Decoding(temperature=0.0, num_beams=2),
        Decoding(stop_ids=frozenset({13})),
    ):
        with pytest.raises(UserError, match="under the emoji grammar or none"):
            VLLMSampler(here, "policy", 2, decoding)
    with pytest.raises(UserError, match="must be > 0"):
        VLLMSampler(here, "policy", 2, Decoding(temperature=0.0))


# --- failures ---------------------------------------------------------------------------------------------


def test_5xx_is_retried_with_backoff(server, smollm2_tokenizer):
    server.fail_next("/v1/completions", 503, 502)
    samples = asyncio.run(sampler_for(server, smollm2_tokenizer).sample([(1, 2, 3)]))
    assert len(samples) == 1 and len(server.bodies("/v1/completions")) == 3


def test_a_server_that_stays_down_is_a_clear_error_after_bounded_retries(lm, smollm2_tokenizer, monkeypatch):
    monkeypatch.setenv(KEY_ENV, "test-key")
    with FakeVLLMServer(lm, ready_after=None) as down:
        sampler = VLLMSampler(endpoint(down, attempts=3), "policy", 2, Decoding())
        start = time.monotonic()
        with pytest.raises(UserError, match=rf"{down.url}/v1/completions did not answer after 3 tries"):
            asyncio.run(sampler.sample([(1, 2, 3)]))
        assert time.monotonic() - start < 5


def test_client_errors_are_not_retried_and_name_the_fix(server, smollm2_tokenizer):
    sampler = sampler_for(server, smollm2_tokenizer)
    sampler.model = "policy-v4"
    with pytest.raises(UserError, match="not loaded there") as caught:
        asyncio.run(sampler.sample([(1, 2, 3)]))
    assert "param model" in str(caught.value) and len(server.requests) == 1
    sampler.model = "policy"
    with pytest.raises(UserError, match="POLICY_MAX_MODEL_LEN"):
        asyncio.run(sampler.sample([tuple(range(1, 1100))]))


def test_a_refused_key_names_the_variable_and_never_the_key(server, smollm2_tokenizer, monkeypatch):
    monkeypatch.setenv(KEY_ENV, "wrong-secret")
    with pytest.raises(UserError, match=KEY_ENV) as caught:
        asyncio.run(sampler_for(server, smollm2_tokenizer).sample([(1, 2)]))
    assert "wrong-secret" not in str(caught.value) and len(server.requests) == 1
    monkeypatch.delenv(KEY_ENV)
    with pytest.raises(UserError, match=f"missing or refused: set {KEY_ENV}"):
        asyncio.run(sampler_for(server, smollm2_tokenizer).sample([(1, 2)]))
    assert "authorization" not in server.requests[-1].headers


# --- verify: served name and logprobs mode ---------------------------------------------------------------


def test_verify_refuses_raw_logprobs_below_temperature_1(lm, smollm2_tokenizer, monkeypatch):
    monkeypatch.setenv(KEY_ENV, "test-key")
    with FakeVLLMServer(lm, logprobs_mode="raw_logprobs") as raw:
        asyncio.run(sampler_for(raw, smollm2_tokenizer, temperature=1.0).verify())
        assert [r.path for r in raw.requests] == ["/v1/models"]  # no probe needed at T=1
        with pytest.raises(UserError, match="--logprobs-mode processed_logprobs"):
            asyncio.run(sampler_for(raw, smollm2_tokenizer, temperature=0.7).verify())
    with FakeVLLMServer(lm, logprobs_mode="processed_logprobs") as processed:
        asyncio.run(sampler_for(processed, smollm2_tokenizer, temperature=0.7).verify())
        probes = processed.bodies("/v1/completions")
        assert [(b["temperature"], b["logprobs"], b["max_tokens"]) for b in probes] == [
            (1.0, 5, 1),
            (0.25, 5, 1),
        ]


def test_verify_names_the_served_models_when_ours_is_missing(server, smollm2_tokenizer):
    sampler = sampler_for(server, smollm2_tokenizer)
    sampler.model = "sender"
    with pytest.raises(UserError, match=r"serves \['policy'\], not 'sender'"):
        asyncio.run(sampler.verify())


@pytest.mark.float_paths
@pytest.mark.parametrize("mode", ["raw_logprobs", "processed_logprobs"])
def test_sampler_logprobs_match_the_trainers_masked_scaled_logprobs(lm, smollm2_tokenizer, monkeypatch, mode):
    """What the decision rests on: with processed_logprobs (or at T=1) the sampler's log-probs are
    exactly log_softmax(masked logits / T), the trainer's formula (batch.token_logprobs)."""
    monkeypatch.setenv(KEY_ENV, "test-key")
    temperature = 0.7 if mode == "processed_logprobs" else 1.0
    constraint = compile_emoji_grammar(smollm2_tokenizer, 2, 8, vocab_size=len(smollm2_tokenizer))
    with FakeVLLMServer(lm, logprobs_mode=mode) as fake:
        [sample] = asyncio.run(
            sampler_for(fake, smollm2_tokenizer, temperature=temperature).sample([(1, 2, 3)])
        )
    ids = list(sample.token_ids)
    context = [1, 2, 3, *ids]
    logits = torch.stack([lm.logits("base:policy", context[: 3 + t]) for t in range(len(ids))])
    trainer = grpo.masked_token_logprobs(
        logits[None], replay_masks(constraint, ids)[None], torch.tensor([ids]), temperature
    )[0]
    # One fp32 log-softmax of the same logits on each side, summed in another order (the fake runs
    # one thread): at most log2(V) ulps of the largest value apart each (tests/floats.py).
    ulps = math.log2(len(smollm2_tokenizer)) * FP32_EPS * float(trainer.abs().max())
    assert list(sample.logprobs) == pytest.approx(trainer.tolist(), abs=2 * ulps)


# --- adapter versions -------------------------------------------------------------------------------------


def test_each_update_loads_a_new_version_and_unloads_stale_ones(server, smollm2_tokenizer, tmp_path):
    sampler = sampler_for(server, smollm2_tokenizer)
    sync = AdapterSync(sampler, tmp_path, base_name="policy", keep=2, session="5e55")
    for step in range(4):
        assert sync.publish(step, save_adapter()) == f"policy-5e55-v{step}"
    root = tmp_path.resolve() / "adapters" / "5e55"
    loads = server.bodies("/v1/load_lora_adapter")
    assert loads == [
        {"lora_name": f"policy-5e55-v{k}", "lora_path": str(root / f"step-{k:06d}"), "load_inplace": False}
        for k in range(4)
    ]
    assert server.bodies("/v1/unload_lora_adapter") == [
        {"lora_name": "policy-5e55-v0"},
        {"lora_name": "policy-5e55-v1"},
    ]
    assert set(server.adapters) == {"policy-5e55-v2", "policy-5e55-v3"}
    assert sorted(p.name for p in root.iterdir()) == ["step-000002", "step-000003"]
    asyncio.run(sampler.sample([(1, 2, 3)]))
    assert server.bodies("/v1/completions")[-1]["model"] == "policy-5e55-v3"
    assert sync.follow("policy-5e55-v5") == "policy-5e55-v5" and sampler.model == "policy-5e55-v5"


def test_no_two_sessions_load_the_same_name_or_path(server, smollm2_tokenizer, tmp_path):
    """vLLM keeps an adapter's cached prefixes under (name, path) after the unload: a rerun or a
    resume that loaded new weights under an earlier session's name and path would be served KV of
    the old weights (docs/VLLM.md §4). Each session draws its own id, so none ever does."""
    for _ in range(3):  # three trainer sessions into one run directory, each from step 0
        sync = AdapterSync(sampler_for(server, smollm2_tokenizer), tmp_path, base_name="policy")
        sync.clear_stale()
        for step in range(2):
            sync.publish(step, save_adapter())
    keys = [(b["lora_name"], b["lora_path"]) for b in server.bodies("/v1/load_lora_adapter")]
    assert len(keys) == 6
    assert len({name for name, _ in keys}) == 6 and len({path for _, path in keys}) == 6


def test_stale_versions_of_an_earlier_session_are_cleared(server, smollm2_tokenizer, tmp_path):
    sampler = sampler_for(server, smollm2_tokenizer)
    root = tmp_path.resolve() / "adapters"
    earlier = AdapterSync(sampler, tmp_path, base_name="policy", session="01d")
    earlier.publish(7, save_adapter())
    older = root / "step-000003"  # what a version of emoji-rl before sessions left
    save_adapter()(older)
    httpx.post(
        server.url + "/v1/load_lora_adapter",
        headers=server.auth,
        json={"lora_name": "policy-v3", "lora_path": str(older)},
    )
    sync = AdapterSync(sampler, tmp_path, base_name="policy", session="9e1")
    assert sorted(sync.clear_stale()) == ["policy-01d-v7", "policy-v3"]
    assert not server.adapters and list(root.iterdir()) == []
    sync.publish(7, save_adapter())
    assert [p.name for p in root.iterdir()] == ["9e1"]


def test_adapter_errors_say_what_to_change(lm, smollm2_tokenizer, tmp_path, monkeypatch):
    monkeypatch.setenv(KEY_ENV, "test-key")
    with FakeVLLMServer(lm, runtime_lora=False) as off:
        sync = AdapterSync(sampler_for(off, smollm2_tokenizer), tmp_path / "a", "policy")
        with pytest.raises(UserError, match="VLLM_ALLOW_RUNTIME_LORA_UPDATING=1"):
            sync.publish(0, save_adapter())
    with FakeVLLMServer(lm, max_lora_rank=16) as small:
        sync = AdapterSync(sampler_for(small, smollm2_tokenizer), tmp_path / "b", "policy")
        # vLLM answers a rank above --max-lora-rank with a 500 it will give again: no retry (they took
        # ~31 s), the hint at once.
        with pytest.raises(
            UserError, match=r"r=32 is above the server's --max-lora-rank 16.*POLICY_MAX_LORA_RANK >= 32"
        ):
            sync.publish(0, save_adapter(rank=32))
        assert len(small.bodies("/v1/load_lora_adapter")) == 1
        # A 500 that may pass is still retried.
        small.fail_next("/v1/load_lora_adapter", 500)
        sync.publish(1, save_adapter(rank=16))
        assert len(small.bodies("/v1/load_lora_adapter")) == 3 and sync.adapter_name(1) in small.adapters
        with pytest.raises(UserError, match=r"no adapter_config\.json"):
            sync.publish(2, lambda path: path.mkdir())


# --- readiness ----------------------------------------------------------------------------------------------


def test_wait_for_server_returns_once_the_server_listens(lm):
    with FakeVLLMServer(lm, ready_after=0.6) as fake:
        start = time.monotonic()
        wait_for_server(fake.url, timeout_s=10, poll_s=0.1)
        assert 0.5 < time.monotonic() - start < 5


def test_wait_for_server_names_the_url_when_it_never_comes_up(lm):
    with (
        FakeVLLMServer(lm, ready_after=None) as down,
        pytest.raises(UserError, match=rf"the server did not answer at {down.url}/health within 0\.5 s"),
    ):
        wait_for_server(down.url + "/v1", timeout_s=0.5, poll_s=0.1)


def test_a_wait_says_what_it_waits_for_and_where_at_once_then_how_long_it_has_waited(caplog):
    from tests.launching import free_port

    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    start = time.time()  # the clock of log records' `created`
    with (
        caplog.at_level("INFO", logger="emoji_rl.endpoint"),
        pytest.raises(
            UserError, match=rf"the judge server did not answer at {url}/health within 1 s .*: HINT"
        ),
    ):
        wait_for_server(url, "the judge server", 1.0, "HINT", poll_s=0.05, progress_s=0.3)
    assert time.time() - start < 3
    said = [(r.created - start, r.getMessage()) for r in caplog.records]
    assert said[0][1] == f"waiting for the judge server at {url}/health (up to 1 s: --server_wait_s)"
    assert said[0][0] < 0.25  # at once, before the first poll and well before the first progress line
    progress = [message for _, message in said[1:] if message.startswith("still waiting")]
    assert all(message.endswith(" s of 1 s (ConnectError)") for message in progress), progress
    waited = [float(message.split(": ")[1].split(" s of")[0]) for message in progress]
    # every 0.3 s of the 1 s wait, with the time waited
    assert len(waited) == 3 and all(0.3 * i <= w < 0.3 * i + 0.25 for i, w in enumerate(waited, 1)), waited


def test_a_port_no_process_holds_on_this_machine_ends_the_wait_early_and_one_held_does_not():
    """vLLM binds its port at its start and listens once its model has loaded, refusing connections
    until then as a port nobody holds does: a port held is a server loading, one not held for the
    grace is a server nobody started."""
    import socket

    from tests.launching import free_port

    from emoji_rl.io.endpoint import port_held

    url = f"http://127.0.0.1:{free_port()}"
    assert port_held(url) is False and port_held("http://10.255.255.1:8002") is None  # not this machine's
    start = time.monotonic()
    with pytest.raises(
        UserError,
        match=r"the policy server does not answer at .* and no process of this machine has held its port for \d+ s .*: point --vllm_url",
    ):
        wait_for_server(url, "the policy server", 5, "point --vllm_url", poll_s=0.05, unheld_s=0.3)
    assert time.monotonic() - start < 4
    with socket.socket() as loading:  # bound, not listening: vLLM while its model loads
        loading.bind(("127.0.0.1", int(url.rsplit(":", 1)[1])))
        assert port_held(url) is True
        with pytest.raises(UserError, match=r"did not answer at .* within 0\.6 s \(ConnectError\)"):
            wait_for_server(url, "the policy server", 0.6, "HINT", poll_s=0.05, unheld_s=0.1)


def test_grpo_waits_for_its_policy_server_before_any_model_loads(monkeypatch, tmp_path, capsys):
    from tests.launching import free_port

    from emoji_rl import cli
    from emoji_rl.rl import train as grpo_train

    def must_not_load(*args, **kwargs):
        raise AssertionError("a model loaded before the policy server answered")

    monkeypatch.setattr(grpo_train.models, "load_tokenizer", must_not_load)
    data = tmp_path / "rl.jsonl"
    data.write_text('{"target": "the cat sleeps"}\n')
    url = f"http://127.0.0.1:{free_port()}"
    argv = [
        "grpo",
        "--engine",
        "vllm",
        "--vllm_url",
        url,
        "--server_wait_s",
        "0.5",
        "--train_data",
        str(data),
    ]
    assert cli.main([*argv, "--judge", "lexicon", "--output_dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert f"the policy server did not answer at {url}/health within 0.5 s" in err
    assert "point --vllm_url at the one running" in err
    assert not (tmp_path / "run").exists()


def test_wait_for_server_stops_at_a_dead_engine(server):
    server.fail_next("/health", 503)
    with pytest.raises(UserError, match="engine is dead"):
        wait_for_server(server.url, timeout_s=10, poll_s=0.1)


# --- the game end to end ------------------------------------------------------------------------------------


def test_retrieval_turns_play_end_to_end_through_the_vllm_sampler(server, smollm2_tokenizer, tmp_path):
    sampler = sampler_for(server, smollm2_tokenizer)
    name = AdapterSync(sampler, tmp_path, "policy", session="1").publish(0, save_adapter())
    rules = RetrievalRules(max_turns=2, tau=0.99)
    builder = RetrievalBuilder(smollm2_tokenizer, LexiconJudge(), WordOverlap(), rules)
    target = "Let's get pizza and watch a movie tonight"
    games = [builder({"target": target}) for _ in range(2)]
    episodes = asyncio.run(play(games, sampler.at(0, name, seed=1)))
    sent = server.bodies("/v1/completions")
    assert all(body["model"] == "policy-1-v0" for body in sent)
    first_prompt = template.chat_ids(smollm2_tokenizer, sender_messages(target))
    assert [body["prompt"] for body in sent[:2]] == [first_prompt, first_prompt]
    constraint = compile_emoji_grammar(smollm2_tokenizer, 2, 8, vocab_size=len(smollm2_tokenizer))
    for episode in episodes:
        assert len(episode.turns) == 2  # tau 0.99 is out of reach: both turns are played
        for turn in episode.turns:
            assert turn.sampler_version == 0
            assert turn.action_ids[-1] == template.stop_token_id(smollm2_tokenizer)
            assert all(lp <= 0 for lp in turn.action_logprobs)
            replay_masks(constraint, turn.action_ids)  # the trainer can replay the grammar over them
        assert episode.turns[-1].result.metrics["format_violation"] == 0.0
    # Turn 2's prompts are turn 1's prompt + action + observation, as token ids: one request each,
    # in whichever order they reached the server.
    assert sorted(body["prompt"] for body in sent[2:]) == sorted(
        [*first_prompt, *turn1.action_ids, *turn1.result.next_observation_ids]
        for turn1 in (episode.turns[0] for episode in episodes)
    )
