"""The openai judge against the fake vLLM server: exact chat requests, cleaned answers, bounded
concurrency, retries and a server that stays down."""

from __future__ import annotations

import asyncio
import time

import pytest
from tests.fakes.fake_lm import FakeLM
from tests.fakes.vllm_server import FakeVLLMServer, default_chat_reply

from emoji_rl.errors import UserError
from emoji_rl.io.endpoint import Endpoint
from emoji_rl.play.guessing import JudgeInput, clean_guess, judge_messages
from emoji_rl.play.judge import OpenAIJudge

KEY_ENV = "EMOJI_RL_TEST_JUDGE_KEY"
EPISODES = [JudgeInput((("🍕", "🎬"),)), JudgeInput((("🍕", "🎬"), ("🍿",)), ("pizza and a movie",))]


@pytest.fixture(scope="module")
def lm(smollm2_tokenizer):
    return FakeLM(smollm2_tokenizer)


@pytest.fixture
def make_server(lm, monkeypatch):
    monkeypatch.setenv(KEY_ENV, "judge-key")
    servers = []

    def make(**kwargs):
        server = FakeVLLMServer(lm, served_model_names=("judge",), api_key="judge-key", **kwargs).start()
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop()


def judge_for(server, attempts=6, **kwargs):
    return OpenAIJudge(
        Endpoint(server.url, api_key_env=KEY_ENV, attempts=attempts, backoff_s=0.01), "judge", "raw", **kwargs
    )


def test_each_episode_is_one_chat_request_with_thinking_off(make_server):
    server = make_server()
    guesses = asyncio.run(judge_for(server).guess(EPISODES))
    requests = [r for r in server.requests if r.path == "/v1/chat/completions"]
    assert all(r.headers["authorization"] == "Bearer judge-key" for r in requests)
    bodies = sorted((r.body for r in requests), key=lambda b: len(b["messages"]))
    assert bodies == [
        {
            "model": "judge",
            "messages": judge_messages(episode, "raw"),
            "temperature": 0.3,
            "max_completion_tokens": 40,
            "chat_template_kwargs": {"enable_thinking": False},
        }
        for episode in EPISODES
    ]
    expected = clean_guess(default_chat_reply([]))
    assert guesses == [expected, expected]
    assert expected.text == "We are going to the beach this weekend." and expected.stripped_emoji


def test_answers_come_back_in_episode_order(make_server):
    server = make_server(chat_reply=lambda messages: f"The message is: guess after {len(messages)} messages.")
    guesses = asyncio.run(judge_for(server).guess(EPISODES * 3))
    first, second = (len(judge_messages(e, "raw")) for e in EPISODES)
    assert [g.text for g in guesses] == [
        f"guess after {first} messages.",
        f"guess after {second} messages.",
    ] * 3


def test_concurrency_is_bounded(make_server):
    def slow_reply(messages):
        time.sleep(0.05)
        return "A guess."

    server = make_server(chat_reply=slow_reply)
    asyncio.run(judge_for(server, max_concurrency=3).guess(EPISODES * 5))
    assert server.max_in_flight == 3


def test_template_kwargs_can_be_left_out_for_servers_that_refuse_unknown_fields(make_server):
    server = make_server()
    asyncio.run(judge_for(server, chat_template_kwargs=None).guess(EPISODES[:1]))
    assert "chat_template_kwargs" not in server.bodies("/v1/chat/completions")[0]


def test_5xx_is_retried(make_server):
    server = make_server()
    server.fail_next("/v1/chat/completions", 500, 503)
    [guess] = asyncio.run(judge_for(server).guess(EPISODES[:1]))
    assert guess.text == "We are going to the beach this weekend."
    assert len(server.bodies("/v1/chat/completions")) == 3


def test_a_judge_server_that_stays_down_is_a_clear_error(make_server):
    down = make_server(ready_after=None)
    with pytest.raises(UserError, match=rf"{down.url}/v1/chat/completions did not answer after 2 tries"):
        asyncio.run(judge_for(down, attempts=2).guess(EPISODES[:1]))


def test_a_wrong_model_name_points_at_the_served_name(make_server):
    server = make_server()
    judge = judge_for(server)
    judge.completer.model = "qwen"
    with pytest.raises(UserError, match="JUDGE_NAME") as caught:
        asyncio.run(judge.guess(EPISODES[:1]))
    assert "param model" in str(caught.value) and len(server.requests) == 1


def test_a_refused_key_names_its_variable_and_is_never_shown(make_server, monkeypatch):
    server = make_server()
    monkeypatch.setenv(KEY_ENV, "not-the-key")
    with pytest.raises(UserError, match=KEY_ENV) as caught:
        asyncio.run(judge_for(server).guess(EPISODES[:1]))
    assert "not-the-key" not in str(caught.value)


def test_describe_names_model_url_and_view(make_server):
    server = make_server()
    assert judge_for(server).describe() == f"openai(judge at {server.url}, view=raw, T=0.3)"
