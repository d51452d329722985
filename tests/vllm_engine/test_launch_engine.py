"""The launch scripts on the CPU layout (GPUS=0) with the real engine: `with_servers.sh` around an
evaluation judged by the server, which judges as the in-process judge does; `gpu_smoke.sh` end to end,
both servers started, two GRPO steps rolled out by vLLM, one evaluation, the servers stopped."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest
import yaml
from tests.launching import ROOT, free_port
from tests.vllm_engine.conftest import KEY_ENV, engine_env

from emoji_rl import cli

pytestmark = pytest.mark.vllm_engine

EVAL = ["--data", "data/samples/rl_eval.jsonl", "--systems", "base", "random", "--max_examples", "4"]
EVAL += ["--distractors", "3"]
EVAL += ["--modes", "single", "--judge_view", "gloss", "--judge_temperature", "0"]


def guesses(out):
    records = json.loads((out / "retrieval.json").read_text())["records"]
    return [(r["system"], r["id"], [t.get("guess") for t in r["turns"]]) for r in records]


def test_an_evaluation_under_with_servers_uses_the_running_servers_and_judges_as_in_process(
    engine, engine_key, tmp_path, capsys
):
    port = engine.url.rsplit(":", 1)[1]
    served = tmp_path / "openai"
    stage = [sys.executable, "-m", "emoji_rl.cli", "eval-retrieval", *EVAL, "--output_dir", str(served)]
    # No --judge_url: with_servers.sh tells the stage where it found the judge.
    stage += ["--judge", "openai", "--judge_model", "judge", "--judge_api_key_env", KEY_ENV]
    done = subprocess.run(
        ["bash", "launch/with_servers.sh", "judge", "--", *stage],
        cwd=ROOT,
        env=engine_env(JUDGE_PORT=port, SERVER_LOG_DIR=str(tmp_path / "servers")),
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert f"judge server already answers at {engine.url}: using it" in done.stderr
    # Left running: it was not started by the script.
    assert httpx.get(engine.url + "/health", timeout=10).status_code == 200

    local = tmp_path / "hf"
    assert cli.main(["eval-retrieval", *EVAL, "--output_dir", str(local), "--judge", "hf"]) == 0
    capsys.readouterr()
    assert guesses(served) == guesses(local)
    assert len(guesses(served)) == 8


def test_gpu_smoke_runs_end_to_end_on_the_cpu_layout(tmp_path):
    """Both servers started by the script on the CPU's vLLM engine, two GRPO steps rolled out by the
    policy server and judged by the judge server, an evaluation of the result, PASS per stage, and
    the servers gone afterwards."""
    grpo = {
        "train_data": "data/samples/rl_eval.jsonl",
        "batch_size": 2,
        "group_size": 2,
        "max_turns": 1,
        "lora_r": 8,
        "max_new_tokens": 24,
        "judge_view": "gloss",
        "judge_temperature": 0.0,
    }
    evaluation = {
        "data": "data/samples/rl_eval.jsonl",
        "modes": ["single"],
        "judge_view": "gloss",
        "distractors": 3,
    }
    (tmp_path / "grpo.yaml").write_text(yaml.safe_dump(grpo))
    (tmp_path / "eval.yaml").write_text(yaml.safe_dump(evaluation))
    judge_port, policy_port = free_port(), free_port()
    smoke = tmp_path / "smoke"
    done = subprocess.run(
        ["bash", "launch/gpu_smoke.sh"],
        cwd=ROOT,
        env=engine_env(
            SMOKE_DIR=str(smoke),
            SMOKE_EXAMPLES="4",
            GRPO_CONFIG=str(tmp_path / "grpo.yaml"),
            EVAL_CONFIG=str(tmp_path / "eval.yaml"),
            JUDGE_PORT=str(judge_port),
            POLICY_PORT=str(policy_port),
            POLICY_MAX_LORA_RANK="8",
            POLICY_MAX_MODEL_LEN="1024",
            JUDGE_MAX_MODEL_LEN="1024",
        ),
        capture_output=True,
        text=True,
        timeout=1500,
        check=False,
    )
    logs = {p.name: p.read_text(errors="replace")[-3000:] for p in smoke.glob("*.log")}
    assert done.returncode == 0, (done.stdout, logs)
    summary = (smoke / "summary.txt").read_text()
    for stage in ("judge-server", "policy-server", "grpo", "eval"):
        assert any(line.split()[:2] == [stage, "PASS"] for line in summary.splitlines()), summary
    loads = (smoke / "policy-server.log").read_text()
    assert "load_lora_adapter" in loads  # the rollouts were the policy server's, under the trainer's adapters
    for port in (judge_port, policy_port):
        with pytest.raises(httpx.TransportError):
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)
