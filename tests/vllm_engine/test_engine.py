"""Our clients against vLLM's real engine: the rollout sampler under the emoji grammar, its log-probs
against the trainer's replayed masks, adapter versions loaded, swapped and unloaded while requests
run, and the judge's chat against the in-process judge."""

from __future__ import annotations

import asyncio
import shutil
import threading
import time

import httpx
import pytest
import torch
from tests.vllm_engine.conftest import KEY, lora_adapter

from emoji_rl.decode.generate import Decoding
from emoji_rl.decode.vllm import VLLMSampler
from emoji_rl.emoji.constraint import compile_emoji_grammar, replay_masks, safe_max_new_tokens
from emoji_rl.emoji.sender_prompts import sender_messages
from emoji_rl.errors import UserError
from emoji_rl.io.endpoint import Endpoint
from emoji_rl.lm import template
from emoji_rl.play.guessing import JudgeInput
from emoji_rl.play.judge import HFJudge, OpenAIJudge
from emoji_rl.rl import grpo
from emoji_rl.rl.rollout.vllm import AdapterSync

pytestmark = pytest.mark.vllm_engine

TARGETS = (
    "Let's grab pizza and watch a movie tonight",
    "I'm so excited for our beach trip this weekend",
    "My cat knocked the birthday cake off the table",
)
TEMPERATURE = 0.7


@pytest.fixture(scope="module")
def adapters(smollm2_model, tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters")
    return [lora_adapter(smollm2_model, root / f"a{seed}", seed) for seed in range(3)]


def sampler_for(engine, tokenizer, engine_key, temperature=1.0) -> VLLMSampler:
    # The budget within which every message the grammar allows reaches end of turn: with less, a
    # sample of 8 multi-token emoji is cut short (seen in CI with 32: no stop token at the end).
    endpoint = Endpoint(engine.url, api_key_env=engine_key, backoff_s=0.2)
    budget = safe_max_new_tokens(8)
    decoding = Decoding(temperature=temperature, max_new_tokens=budget)
    return VLLMSampler(endpoint, "policy", template.stop_token_id(tokenizer), decoding)


def copy_of(adapter):
    return lambda path: shutil.copytree(adapter, path)


def prompts(tokenizer):
    return [tuple(template.chat_ids(tokenizer, sender_messages(t))) for t in TARGETS]


def test_the_sampler_checks_the_server_and_samples_within_the_grammar(engine, engine_key, smollm2_tokenizer):
    sampler = sampler_for(engine, smollm2_tokenizer, engine_key, temperature=TEMPERATURE)
    asyncio.run(sampler.verify())  # served name, and processed log-probs below T 1 (the probe)
    constraint = compile_emoji_grammar(smollm2_tokenizer, 2, 8, vocab_size=len(smollm2_tokenizer))
    samples = asyncio.run(sampler.sample(prompts(smollm2_tokenizer) * 2))
    assert len(samples) == 2 * len(TARGETS)
    ends = set(template.end_of_turn_ids(smollm2_tokenizer))
    for sample in samples:
        assert sample.token_ids[-1] in ends, sample
        assert len(sample.logprobs) == len(sample.token_ids) and all(lp <= 0 for lp in sample.logprobs)
        replay_masks(constraint, sample.token_ids)  # raises on a token the grammar forbids
        emoji = smollm2_tokenizer.decode(sample.token_ids[:-1])
        assert emoji and not any(c.isascii() and not c.isspace() for c in emoji), emoji


def test_the_engines_logprobs_are_the_trainers_under_the_grammar_and_an_adapter(
    engine, engine_key, smollm2_tokenizer, smollm2_model, adapters, tmp_path
):
    """What the importance weights and `sampler/kl_vs_trainer` rest on: the log-probs the engine
    returns for its samples (processed: masked, then at temperature) are the trainer's
    log_softmax(masked logits / T) on the same tokens, the masks replayed by the trainer's own grammar."""
    from peft import PeftModel

    sampler = sampler_for(engine, smollm2_tokenizer, engine_key, temperature=TEMPERATURE)
    sync = AdapterSync(sampler, tmp_path, "policy")
    sync.publish(0, copy_of(adapters[0]))
    asked = prompts(smollm2_tokenizer)
    samples = asyncio.run(sampler.sample(asked))
    constraint = compile_emoji_grammar(smollm2_tokenizer, 2, 8, vocab_size=len(smollm2_tokenizer))
    policy = PeftModel.from_pretrained(smollm2_model, str(adapters[0]), adapter_name="engine-test")
    gaps = []
    try:
        with torch.no_grad():
            for prompt, sample in zip(asked, samples, strict=True):
                ids = torch.tensor([[*prompt, *sample.token_ids]])
                logits = policy(ids).logits[:, len(prompt) - 1 : -1]
                masks = replay_masks(constraint, sample.token_ids)[None]
                ours = grpo.masked_token_logprobs(
                    logits, masks, torch.tensor([sample.token_ids]), TEMPERATURE
                )
                gaps += (ours[0] - torch.tensor(sample.logprobs)).abs().tolist()
    finally:
        policy.unload()  # smollm2_model is shared by the session: leave it unadapted
    print(
        f"engine vs trainer log-probs: {len(gaps)} tokens, mean gap {sum(gaps) / len(gaps):.1e}, max {max(gaps):.1e}"
    )
    assert max(gaps) < 1e-3, gaps
    # The adapter changes the distribution: the same tokens under the base model score otherwise.
    with torch.no_grad():
        prompt, sample = asked[0], samples[0]
        ids = torch.tensor([[*prompt, *sample.token_ids]])
        logits = smollm2_model(ids).logits[:, len(prompt) - 1 : -1]
        masks = replay_masks(constraint, sample.token_ids)[None]
        base = grpo.masked_token_logprobs(logits, masks, torch.tensor([sample.token_ids]), TEMPERATURE)
    assert (base[0] - torch.tensor(sample.logprobs)).abs().max() > 1e-2


def test_adapter_versions_swap_while_requests_run(engine, engine_key, smollm2_tokenizer, adapters, tmp_path):
    """Rollouts go on while the trainer publishes: each version is loaded before the sampler moves to
    it, and the one before stays loaded (keep 2) for requests still using it; nothing fails."""
    sampler = sampler_for(engine, smollm2_tokenizer, engine_key, temperature=1.0)
    sync = AdapterSync(sampler, tmp_path, "policy", keep=2)
    sync.clear_stale()
    sync.publish(0, copy_of(adapters[0]))
    errors: list[BaseException] = []
    served: list[str] = []
    stop = threading.Event()

    def roll() -> None:
        while not stop.is_set():
            try:
                served.append(sampler.model)
                asyncio.run(sampler.sample(prompts(smollm2_tokenizer)[:1]))
            except BaseException as err:
                errors.append(err)
                return

    worker = threading.Thread(target=roll)
    worker.start()
    try:
        for step, adapter in enumerate(adapters[1:], 1):
            sync.publish(step, copy_of(adapter))
            # The next request goes out under the new version while the last one's may still run.
            deadline = time.monotonic() + 120
            while sync.adapter_name(step) not in served and not errors and time.monotonic() < deadline:
                time.sleep(0.1)
    finally:
        stop.set()
        worker.join(timeout=300)
    assert not errors, errors
    cards = httpx.get(engine.url + "/v1/models", headers={"Authorization": f"Bearer {KEY}"}).json()["data"]
    loaded = sorted(card["id"] for card in cards if card["id"].startswith("policy-"))
    assert loaded == [sync.adapter_name(1), sync.adapter_name(2)]
    assert set(served) == {sync.adapter_name(step) for step in range(3)}, served
    # Unloaded means gone: the oldest version is refused by name, with the hint.
    sampler.model = sync.adapter_name(0)
    with pytest.raises(UserError, match="not loaded there"):
        asyncio.run(sampler.sample(prompts(smollm2_tokenizer)[:1]))


def test_an_adapter_above_the_servers_rank_is_refused_with_the_flag_to_raise(
    engine, engine_key, smollm2_tokenizer, smollm2_model, tmp_path
):
    sampler = sampler_for(engine, smollm2_tokenizer, engine_key)
    wide = lora_adapter(smollm2_model, tmp_path / "wide", seed=0, rank=32)
    sync = AdapterSync(sampler, tmp_path / "run", "policy")
    with pytest.raises(
        UserError, match=r"r=32 is above the server's --max-lora-rank 16.*POLICY_MAX_LORA_RANK >= 32"
    ):
        sync.publish(0, copy_of(wide))


def test_the_judge_server_guesses_as_the_in_process_judge(
    engine, engine_key, smollm2_tokenizer, smollm2_model
):
    """The same model, greedy, the same prompt: the chat the openai judge sends, rendered by vLLM with
    the model's template, is answered as the hf judge answers it in this process."""
    episodes = [
        JudgeInput((("🍕", "🎬"),)),
        JudgeInput((("🏖️", "😎", "🌊"),)),
        JudgeInput((("🐱", "🎂"), ("😱",)), ("A cat and a birthday cake.",)),
    ]
    served = OpenAIJudge(Endpoint(engine.url, api_key_env=engine_key), "judge", "gloss", temperature=0.0)
    local = HFJudge(smollm2_model, smollm2_tokenizer, "gloss", name="smollm2", temperature=0.0)
    remote_guesses = asyncio.run(served.guess(episodes))
    local_guesses = asyncio.run(local.guess(episodes))
    assert [g.text for g in remote_guesses] == [g.text for g in local_guesses]
    assert all(g.text != "[unknown]" for g in remote_guesses)
