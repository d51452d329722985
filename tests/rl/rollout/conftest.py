"""The fake vLLM server the rollout tests talk to, with a key, and an endpoint for it."""

import pytest
from tests.fakes.fake_lm import FakeLM
from tests.fakes.vllm_server import FakeVLLMServer

from emoji_rl.io.endpoint import Endpoint

KEY_ENV = "EMOJI_RL_TEST_POLICY_KEY"


@pytest.fixture(scope="module")
def lm(smollm2_tokenizer):
    return FakeLM(smollm2_tokenizer)


@pytest.fixture
def server(lm, monkeypatch):
    monkeypatch.setenv(KEY_ENV, "test-key")
    with FakeVLLMServer(lm, max_model_len=1024) as fake:
        yield fake


def endpoint(server, **kwargs):
    return Endpoint(server.url + "/v1", api_key_env=KEY_ENV, backoff_s=0.01, **kwargs)
