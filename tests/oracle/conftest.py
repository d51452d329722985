"""The oracle tests' fixtures: vLLM's own code in a subprocess (`vllm_oracle`), and the traffic our
real clients exchange with the fake vLLM server (`traffic`), recorded once per session."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.fakes.fake_lm import FakeLM
from tests.fakes.vllm_server import FakeVLLMServer, Payload

from emoji_rl.models import chat_ids, stop_token_id
from emoji_rl.prompts import sender_messages
from emoji_rl.rl.endpoint import Endpoint
from emoji_rl.rl.judge import JudgeInput
from emoji_rl.rl.judge_openai import OpenAIJudge
from emoji_rl.rl.rollout.vllm import AdapterSync, VLLMSampler

ROOT = Path(__file__).resolve().parents[2]
CONTRACT = Path(__file__).with_name("contract.py")
VENV = ROOT / ".venv-vllm-cpu"
KEY_ENV = "EMOJI_RL_TEST_ORACLE_KEY"


class Oracle:
    """contract.py under the contract venv: `oracle(op, **args)` is one job, answered by vLLM's code."""

    def __init__(self, python: Path) -> None:
        self._stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (closed by close())
        env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "PYTHONPATH": ""}
        self._process = subprocess.Popen(
            [str(python), str(CONTRACT)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            env=env,
        )
        self.version = self._read()["ready"]

    def _read(self) -> dict[str, Any]:
        assert self._process.stdout is not None
        line = self._process.stdout.readline()
        if not line:
            self._stderr.seek(0)
            pytest.fail(f"{CONTRACT.name} died; its stderr ends with:\n{self._stderr.read()[-3000:]}")
        return json.loads(line)

    def __call__(self, op: str, **args: Any) -> Any:
        assert self._process.stdin is not None
        self._process.stdin.write(json.dumps({"op": op, "args": args}) + "\n")
        self._process.stdin.flush()
        reply = self._read()
        if "error" in reply:
            pytest.fail(f"vLLM's code raised in {op}:\n{reply['error']}")
        return reply["result"]

    def close(self) -> None:
        assert self._process.stdin is not None
        self._process.stdin.close()
        try:
            self._process.wait(timeout=2)
        except subprocess.TimeoutExpired:  # vLLM's exit handlers take seconds; it holds no state
            self._process.kill()
            self._process.wait()
        self._stderr.close()


@pytest.fixture(scope="session")
def vllm_oracle():
    python = VENV / "bin" / "python"
    if not python.is_file():
        # Not a skip: these tests are how the GPU path is checked here, and CI builds the venv.
        pytest.fail(
            f"{python} is missing: these tests run vLLM 0.33's own code from the contract venv. "
            "Build it with `make setup-vllm-cpu` (`make test` builds it first, as CI does)",
            pytrace=False,
        )
    oracle = Oracle(python)
    yield oracle
    oracle.close()


@dataclass(frozen=True)
class Exchange:
    source: str
    """"ours": sent by emoji_rl's clients; "probe": sent by the test, to draw out an error answer."""
    path: str
    body: Any
    status: int
    answer: Payload


class RecordingServer(FakeVLLMServer):
    """The fake server, keeping each answer beside the request it records."""

    source = "ours"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.exchanges: list[Exchange] = []

    def dispatch(self, method: str, path: str, headers: dict[str, str], raw: bytes) -> tuple[int, Payload]:
        status, payload = super().dispatch(method, path, headers, raw)
        self.exchanges.append(Exchange(self.source, path, self.requests[-1].body, status, payload))
        return status, payload


def _save_adapter(path: Path) -> None:
    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text(json.dumps({"r": 8, "peft_type": "LORA"}))


@pytest.fixture(scope="session")
def traffic(smollm2_tokenizer, tmp_path_factory) -> list[Exchange]:
    """Every request emoji_rl's vLLM clients send in a run (the rollout sampler's verify and sample,
    AdapterSync's loads and unloads, the openai judge's chat), and the fake server's answers, plus
    probes the test sends for the fake's error answers."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv(KEY_ENV, "oracle-key")
        return _play(FakeLM(smollm2_tokenizer), smollm2_tokenizer, tmp_path_factory.mktemp("oracle-run"))


def _play(lm: FakeLM, tokenizer, run_dir: Path) -> list[Exchange]:
    exchanges: list[Exchange] = []
    with RecordingServer(lm, api_key="oracle-key", logprobs_mode="processed_logprobs") as policy:
        endpoint = Endpoint(policy.url, api_key_env=KEY_ENV, backoff_s=0.01)
        sampler = VLLMSampler(endpoint, "policy", stop_token_id(tokenizer), temperature=0.7)
        asyncio.run(sampler.verify())
        sync = AdapterSync(sampler, run_dir, "policy", keep=1)
        sync.clear_stale()
        for step in range(2):
            sync.publish(step, _save_adapter)
        prompts = [tuple(chat_ids(tokenizer, sender_messages(t))) for t in ("Pizza tonight?", "Beach!")]
        asyncio.run(sampler.sample(prompts))
        # a free-text game's batch (Wordle): no grammar
        free = VLLMSampler(endpoint, "policy", stop_token_id(tokenizer), temperature=0.7, grammar=False)
        asyncio.run(free.sample(prompts[:1]))
        policy.source = "probe"
        with httpx.Client(base_url=policy.url, headers=policy.auth) as client:
            client.post("/v1/completions", json={"model": "nobody", "prompt": [1, 2]})
            client.post("/v1/completions", json={"prompt": [-1]})
            client.post("/v1/completions", json={"prompt": [1], "logprobs": 50})
            client.post("/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": "/tmp/no-adapter-here"})
            client.post("/v1/unload_lora_adapter", json={"lora_name": "never-loaded"})
        exchanges += policy.exchanges
    with RecordingServer(lm, served_model_names=("judge",), api_key="oracle-key") as judge_server:
        judge = OpenAIJudge(Endpoint(judge_server.url, api_key_env=KEY_ENV), "judge", "raw")
        asyncio.run(judge.guess([JudgeInput((("🍕", "🎬"),)), JudgeInput((("🍕",), ("🍿",)), ("pizza",))]))
        exchanges += judge_server.exchanges
    return exchanges
