"""Faults with a real server: GRPO started before its policy server is up waits for it, a server
killed in the middle of a run ends the run with the URL and what to do, and a resume once a server
answers again goes on from the last checkpoint."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from tests.launching import ROOT, free_port
from tests.vllm_engine.conftest import KEY_ENV, Server, engine_env, start_server

from emoji_rl.io.metrics import read_metrics

pytestmark = pytest.mark.vllm_engine


def grpo(url: str, out, *extra: str, key_env: str = "none") -> list[str]:
    return [
        sys.executable, "-m", "emoji_rl.cli", "grpo",
        "--train_data", "data/samples/rl_eval.jsonl",
        "--output_dir", str(out),
        "--batch_size", "2",
        "--group_size", "2",
        "--max_turns", "1",
        "--lora_r", "8",
        "--save_steps", "1",
        "--max_new_tokens", "24",
        "--judge", "lexicon",
        "--engine", "vllm",
        "--vllm_url", url,
        "--vllm_api_key_env", key_env,
        *extra,
    ]  # fmt: skip


def test_a_slow_server_is_waited_for_a_dead_one_named_and_a_resume_goes_on(engine, tmp_path):
    port = free_port()
    env = engine_env(POLICY_PORT=str(port), POLICY_MAX_LORA_RANK="8", POLICY_MAX_MODEL_LEN="512")
    url = f"http://127.0.0.1:{port}"
    out = tmp_path / "run"
    log = tmp_path / "grpo.log"
    # The trainer first, the server after it: it waits while the model loads.
    with log.open("w") as sink:
        trainer = subprocess.Popen(
            grpo(url, out, "--max_steps", "4", "--server_wait_s", "600"),
            cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT,
        )  # fmt: skip
    server: Server | None = None
    try:
        server = start_server("serve_policy.sh", tmp_path / "server.log", env, port=port)
        # Kill the server once a step is checkpointed.
        latest = out / "checkpoints" / "latest"
        deadline = time.monotonic() + 600
        while not latest.is_file() and trainer.poll() is None and time.monotonic() < deadline:
            time.sleep(1)
        assert latest.is_file(), log.read_text()[-4000:]
        server.kill()
        assert trainer.wait(timeout=600) != 0
    finally:
        if trainer.poll() is None:
            trainer.kill()
        if server is not None:
            server.stop()
    said = log.read_text()
    assert f"waiting for the policy server at {url}/health" in said
    assert f"{url}/v1/" in said and "Traceback" not in said, said[-4000:]
    done = {m["step"] for m in read_metrics(out)}
    assert done and max(done) < 4

    # Another server (the session's) answers now: the run goes on from its checkpoint there.
    resumed = subprocess.run(
        grpo(engine.url, out, "--max_steps", "4", "--resume", "true", key_env=KEY_ENV),
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert "resumed from" in resumed.stderr
    assert sorted(m["step"] for m in read_metrics(out)) == [1, 2, 3, 4]
