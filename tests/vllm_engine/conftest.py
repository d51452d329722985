"""The real vLLM 0.33 engine, built for the CPU (`make setup-vllm-engine`), serving the embedded SmolLM2
as the policy and as the judge: one server for the whole pytest process, started with the project's
own `launch/serve_policy.sh` on the CPU layout (GPUS=0). `make test` runs these tests in one process
after the rest, so the server starts once (about a minute and a half on 2 cores)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from tests.launching import ROOT, free_port

ENGINE_VENV = ROOT / ".venv-vllm-engine"
KEY_ENV = "EMOJI_RL_TEST_ENGINE_KEY"
KEY = "engine-key"
MAX_LORA_RANK = 16
MAX_MODEL_LEN = 1024
# The CPU engine's default block is 128 tokens, longer than a one-turn prompt (~65): nothing would be
# cached. 32, as GPU servers' small blocks, puts whole blocks of every prompt in the prefix cache.
BLOCK_SIZE = 32
START_S = 600


def engine_env(**extra: str) -> dict[str, str]:
    """The environment the launch scripts get: the CPU layout, the engine's venv, fp32 on 2 threads."""
    return {
        **os.environ,
        "GPUS": "0",
        "PYTHON": sys.executable,
        "VLLM": str(ENGINE_VENV / "bin" / "vllm"),
        "OMP_NUM_THREADS": "2",
        KEY_ENV: KEY,
        **extra,
    }


def require_engine() -> None:
    if (ENGINE_VENV / "bin" / "vllm").is_file():
        return
    message = f"{ENGINE_VENV} is missing: build vLLM's engine for the CPU with `make setup-vllm-engine`"
    if os.environ.get("EMOJI_RL_VLLM_ENGINE") == "required":
        pytest.fail(message + " (make test builds it first)", pytrace=False)
    pytest.skip(message)


@dataclass
class Server:
    """A `vllm serve` started by a launch script, in its own process group."""

    url: str
    log: Path
    process: subprocess.Popen

    def log_tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    def kill(self) -> None:
        """SIGKILL to the whole group: the API server and the engine die at once, as in a crash."""
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


def start_server(
    script: str, log: Path, env: dict[str, str], *args: str, port_var: str = "POLICY_PORT", port: int = 0
) -> Server:
    """`launch/<script> args` with `env` on `port` (0: a free one), waited for until /health answers
    (or it dies: its log then)."""
    port = port or free_port()
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        process = subprocess.Popen(
            ["bash", str(ROOT / "launch" / script), *args],
            cwd=ROOT,
            env={**env, port_var: str(port)},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    server = Server(f"http://127.0.0.1:{port}", log, process)
    start = time.monotonic()
    while time.monotonic() - start < START_S:
        if process.poll() is not None:
            pytest.fail(f"{script} exited ({process.returncode}) before answering:\n{server.log_tail()}")
        try:
            if httpx.get(server.url + "/health", timeout=5).status_code == 200:
                return server
        except httpx.TransportError:
            pass
        time.sleep(2)
    server.stop()
    pytest.fail(f"{script} gave no answer at {server.url}/health in {START_S} s:\n{server.log_tail()}")


@pytest.fixture(scope="session")
def engine(tmp_path_factory) -> Server:
    """One policy server for the session, also served under the name `judge`, with a key."""
    require_engine()
    env = engine_env(
        POLICY_MAX_LORA_RANK=str(MAX_LORA_RANK),
        POLICY_MAX_MODEL_LEN=str(MAX_MODEL_LEN),
        POLICY_API_KEY=KEY,
    )
    log = tmp_path_factory.mktemp("engine") / "policy-server.log"
    # Later flags win: the served names replace serve_policy.sh's single POLICY_NAME.
    server = start_server(
        "serve_policy.sh",
        log,
        env,
        "--served-model-name",
        "policy",
        "judge",
        "--block-size",
        str(BLOCK_SIZE),
    )
    yield server
    server.stop()


@pytest.fixture
def engine_key(monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY)
    return KEY_ENV


def lora_adapter(model, path: Path, seed: int, rank: int = 8, scale: float = 0.5) -> Path:
    """A random LoRA adapter for `model` (both factors random, so it moves the logits), saved as PEFT
    saves one; a copy of `model` is adapted, `model` itself is left as it was."""
    import copy

    import torch
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    config = LoraConfig(
        r=rank,
        lora_alpha=2 * rank,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
        init_lora_weights=False,
        task_type="CAUSAL_LM",
    )
    peft = get_peft_model(copy.deepcopy(model), config)
    with torch.no_grad():
        for name, param in peft.named_parameters():
            if "lora_" in name:
                param.mul_(scale)
    peft.save_pretrained(str(path))
    assert json.loads((path / "adapter_config.json").read_text())["r"] == rank
    return path
