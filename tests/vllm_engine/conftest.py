"""The real vLLM 0.33 engine, built for the CPU (`make setup-vllm-engine`), serving the embedded SmolLM2
as the policy and as the judge: one server for the whole pytest process, started with the project's
own `launch/serve_policy.sh` on the CPU layout (GPUS=0). `make test` runs these tests in one process
after the rest, so the server starts once (about a minute and a half on 2 cores)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from emoji_rl.bench import engine as launched
from emoji_rl.bench.engine import ENGINE_VENV, Server

KEY_ENV = "EMOJI_RL_TEST_ENGINE_KEY"
KEY = "engine-key"
MAX_LORA_RANK = 16
MAX_MODEL_LEN = 1024
# The CPU engine's default block is 128 tokens, longer than a one-turn prompt (~65): nothing would be
# cached. 32, as GPU servers' small blocks, puts whole blocks of every prompt in the prefix cache.
BLOCK_SIZE = 32
MAX_OFF_POLICY_STEPS = 2  # the most any test's rollouts lag (test_grpo.py's K = 2)


def engine_env(**extra: str) -> dict[str, str]:
    """The environment the launch scripts get: the CPU layout, the engine's venv, fp32 on 2 threads."""
    return launched.engine_env(OMP_NUM_THREADS="2", **{KEY_ENV: KEY}, **extra)


def require_engine() -> None:
    if (ENGINE_VENV / "bin" / "vllm").is_file():
        return
    message = f"{ENGINE_VENV} is missing: build vLLM's engine for the CPU with `make setup-vllm-engine`"
    if os.environ.get("EMOJI_RL_VLLM_ENGINE") == "required":
        pytest.fail(message + " (make test builds it first)", pytrace=False)
    pytest.skip(message)


def start_server(script: str, log: Path, env: dict[str, str], *args: str, **kwargs) -> Server:
    """`bench.engine.start_server`, its failure a test failure with the server's log."""
    try:
        return launched.start_server(script, log, env, *args, **kwargs)
    except launched.ServerFailed as failed:
        pytest.fail(str(failed), pytrace=False)


@pytest.fixture(scope="session")
def engine(tmp_path_factory) -> Server:
    """One policy server for the session, also served under the name `judge`, with a key; sized for
    rollouts up to two versions behind (--max-loras 3, --max-cpu-loras 4), as serve_policy.sh sizes it."""
    require_engine()
    env = engine_env(
        POLICY_MAX_LORA_RANK=str(MAX_LORA_RANK),
        POLICY_MAX_MODEL_LEN=str(MAX_MODEL_LEN),
        POLICY_API_KEY=KEY,
        MAX_OFF_POLICY_STEPS=str(MAX_OFF_POLICY_STEPS),
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
