"""The launch scripts' --dry-run commands carry the flags the GPU setup needs (no GPU, no vLLM here):
each printed command is parsed with shlex, and the launcher's own argument parser reads it where
it is installed (accelerate, torchrun)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from emoji_rl.rl.rollout.vllm import LOGPROBS_MODE

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ["serve_judge.sh", "serve_policy.sh", "train_grpo.sh", "gpu_smoke.sh"]


def run(script, *args, **env):
    # A bare environment, so a setting exported on the developer's machine cannot leak in.
    base = {
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", "/tmp"),
        "VLLM": "vllm",
        "PYTHON": "python3",
    }
    return subprocess.run(
        ["bash", str(ROOT / "launch" / script), *args],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def dry_run(script, *args, **env):
    """The printed commands, as argument lists (comment lines dropped)."""
    result = run(script, "--dry-run", *args, **env)
    assert result.returncode == 0, result.stderr
    return [shlex.split(line) for line in result.stdout.splitlines() if line and not line.startswith("#")]


def flag(argv, name):
    assert argv.count(name) == 1, (name, argv)
    return argv[argv.index(name) + 1]


def split_env(argv):
    """`env A=1 B=2 cmd ...` -> ({A: 1, B: 2}, [cmd, ...])."""
    if argv[0] != "env":
        return {}, argv
    rest = argv[1:]
    n = next(i for i, arg in enumerate(rest) if "=" not in arg)
    return dict(arg.split("=", 1) for arg in rest[:n]), rest[n:]


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_lists_the_settings_and_runs_nothing(script):
    result = run(script, "--help")
    assert result.returncode == 0 and "Settings (environment, default):" in result.stdout
    assert "--dry-run" in result.stdout


# --- serve_judge.sh ------------------------------------------------------------------------------------


def test_judge_server_defaults():
    [argv] = dry_run("serve_judge.sh")
    env, cmd = split_env(argv)
    assert env == {}
    assert cmd[:3] == ["vllm", "serve", "Qwen/Qwen3-30B-A3B-Instruct-2507"]
    assert flag(cmd, "--host") == "127.0.0.1" and flag(cmd, "--port") == "8001"
    assert flag(cmd, "--served-model-name") == "judge"
    assert flag(cmd, "--tensor-parallel-size") == "2" and flag(cmd, "--data-parallel-size") == "1"
    assert flag(cmd, "--generation-config") == "vllm"
    # Thinking is off per request; a parser or a key on the command line would be wrong here.
    assert not {"--reasoning-parser", "--api-key", "--enable-expert-parallel"} & set(cmd)


def test_judge_server_settings_and_the_key_never_printed():
    result = run(
        "serve_judge.sh", "--dry-run", "--max-num-seqs", "256",
        JUDGE_GPUS="4,5", JUDGE_TP="1", JUDGE_DP="2", JUDGE_EP="1", JUDGE_PORT="9001", JUDGE_API_KEY="s3cret",
    )  # fmt: skip
    assert "s3cret" not in result.stdout + result.stderr
    [argv] = [shlex.split(result.stdout)]
    env, cmd = split_env(argv)
    assert env == {"CUDA_VISIBLE_DEVICES": "4,5"}
    assert flag(cmd, "--tensor-parallel-size") == "1" and flag(cmd, "--data-parallel-size") == "2"
    assert "--enable-expert-parallel" in cmd and flag(cmd, "--port") == "9001"
    assert cmd[-2:] == ["--max-num-seqs", "256"]


# --- serve_policy.sh -----------------------------------------------------------------------------------


def test_policy_server_has_runtime_lora_xgrammar_and_the_logprobs_mode_the_sampler_checks():
    [argv] = dry_run("serve_policy.sh", POLICY_GPUS="2")
    env, cmd = split_env(argv)
    assert env == {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1", "CUDA_VISIBLE_DEVICES": "2"}
    assert cmd[:3] == ["vllm", "serve", "Qwen/Qwen3.5-4B"]
    assert "--enable-lora" in cmd
    assert flag(cmd, "--max-lora-rank") == "32"
    assert flag(cmd, "--max-loras") == "2" and flag(cmd, "--max-cpu-loras") == "4"
    assert flag(cmd, "--structured-outputs-config.backend") == "xgrammar"
    assert flag(cmd, "--logprobs-mode") == LOGPROBS_MODE == "processed_logprobs"
    assert flag(cmd, "--generation-config") == "vllm"
    assert flag(cmd, "--host") == "127.0.0.1" and flag(cmd, "--served-model-name") == "policy"
    assert "--reasoning-parser" not in cmd  # the grammar would not apply until reasoning ended


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"POLICY_MAX_LORA_RANK": "24"}, "POLICY_MAX_LORA_RANK=24 must be one of"),
        (
            {"POLICY_MAX_LORAS": "4", "POLICY_MAX_CPU_LORAS": "2"},
            "POLICY_MAX_CPU_LORAS=2 must be an integer >= 4",
        ),
    ],
)
def test_policy_server_refuses_settings_vllm_would_refuse(env, message):
    result = run("serve_policy.sh", "--dry-run", **env)
    assert result.returncode == 2 and message in result.stderr


# --- train_grpo.sh -------------------------------------------------------------------------------------


def accelerate_args(argv):
    from accelerate.commands.launch import launch_command_parser

    assert argv[1:3] == ["-m", "accelerate.commands.launch"]
    return launch_command_parser().parse_args(argv[3:])


def test_grpo_single_node_accelerate():
    [argv] = dry_run("train_grpo.sh", "--max_steps", "2", NGPUS="4")
    args = accelerate_args(argv)
    assert (args.num_processes, args.num_machines, args.machine_rank) == (4, 1, 0)
    assert args.config_file == "configs/accelerate/ddp.yaml" and args.main_process_port == 29500
    assert args.module and args.training_script == "emoji_rl.cli"
    assert args.training_script_args == ["grpo", "--config", "configs/gpu/grpo.yaml", "--max_steps", "2"]


def test_grpo_multi_node_accelerate_counts_processes_over_all_nodes():
    env = {"NGPUS": "8", "NNODES": "2", "NODE_RANK": "1", "MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "29555"}
    [argv] = dry_run("train_grpo.sh", STRATEGY="fsdp", **env)
    args = accelerate_args(argv)
    assert (args.num_processes, args.num_machines, args.machine_rank) == (16, 2, 1)
    assert (args.main_process_ip, args.main_process_port) == ("10.1.2.3", 29555)
    assert args.config_file == "configs/accelerate/fsdp.yaml"


def test_grpo_torchrun():
    from torch.distributed.run import get_args_parser

    env = {"NGPUS": "8", "NNODES": "2", "NODE_RANK": "1", "MASTER_ADDR": "10.1.2.3", "LAUNCHER": "torchrun"}
    [argv] = dry_run("train_grpo.sh", **env)
    assert argv[1:3] == ["-m", "torch.distributed.run"]
    args = get_args_parser().parse_args(argv[3:])
    assert (args.nnodes, args.node_rank, args.nproc_per_node) == ("2", 1, "8")
    assert (args.master_addr, args.master_port) == ("10.1.2.3", 29500)
    assert args.module and args.training_script == "emoji_rl.cli"


def test_grpo_on_chosen_gpus_takes_one_process_per_gpu():
    [argv] = dry_run("train_grpo.sh", TRAIN_GPUS="2,3")
    env, cmd = split_env(argv)
    assert env == {"CUDA_VISIBLE_DEVICES": "2,3"} and accelerate_args(cmd).num_processes == 2


def test_grpo_refuses_a_node_rank_outside_the_job():
    result = run("train_grpo.sh", "--dry-run", NNODES="2", NODE_RANK="2")
    assert result.returncode == 2 and "NODE_RANK=2 must be below NNODES=2" in result.stderr


@pytest.mark.parametrize("name", ["ddp", "fsdp"])
def test_accelerate_configs_parse(name):
    config = yaml.safe_load((ROOT / "configs" / "accelerate" / f"{name}.yaml").read_text())
    assert config["distributed_type"] in {"MULTI_GPU", "FSDP"} and config["mixed_precision"] == "bf16"


# --- gpu_smoke.sh --------------------------------------------------------------------------------------


def test_gpu_smoke_dry_run_prints_every_stage():
    result = run("gpu_smoke.sh", "--dry-run")
    assert result.returncode == 0, result.stderr
    comments = [line for line in result.stdout.splitlines() if line.startswith("#")]
    assert [c.split(":")[0] for c in comments if c.startswith("# stage")] == [
        "# stage judge-server", "# stage policy-server", "# stage grpo", "# stage eval",
    ]  # fmt: skip
    judge, policy, wait_judge, wait_policy, grpo, evaluate = dry_run("gpu_smoke.sh")
    assert split_env(judge)[0] == {"CUDA_VISIBLE_DEVICES": "0,1"}
    assert flag(judge, "--tensor-parallel-size") == "2"
    assert split_env(policy)[0]["CUDA_VISIBLE_DEVICES"] == "2"
    assert wait_judge[1:4] == ["-m", "emoji_rl.rl.endpoint", "http://127.0.0.1:8001"]
    assert wait_policy[3] == "http://127.0.0.1:8002"
    env, cmd = split_env(grpo)
    assert env == {"CUDA_VISIBLE_DEVICES": "3"}
    stage = accelerate_args(cmd).training_script_args
    assert flag(stage, "--max_steps") == "2" and flag(stage, "--engine") == "vllm"
    assert flag(stage, "--vllm_url") == "http://127.0.0.1:8002" and flag(stage, "--judge") == "openai"
    assert flag(stage, "--judge_url") == "http://127.0.0.1:8001"
    assert "eval-retrieval" in evaluate and flag(evaluate, "--judge") == "openai"
    assert evaluate[evaluate.index("--systems") :][:3] == [
        "--systems",
        "base",
        "rl=runs/gpu-smoke/grpo/adapter",
    ]


def test_gpu_smoke_on_two_gpus():
    env = {"JUDGE_GPUS": "0", "POLICY_GPUS": "1", "TRAIN_GPUS": "1", "POLICY_GPU_MEMORY": "0.45"}
    judge, policy, *_ = dry_run("gpu_smoke.sh", **env)
    assert flag(judge, "--tensor-parallel-size") == "1"
    assert flag(policy, "--gpu-memory-utilization") == "0.45"


# --- make targets ----------------------------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
@pytest.mark.parametrize(
    ("target", "variables", "expected"),
    [
        (
            "rl",
            ["PROFILE=gpu", "NGPUS=4", "ARGS=--max_steps 3"],
            "NGPUS=4 launch/train_grpo.sh --max_steps 3",
        ),
        ("sft", ["PROFILE=gpu", "NGPUS=2"], "NGPUS=2 launch/train_sft.sh"),
        ("serve-judge", ["PROFILE=gpu", "NGPUS=2"], "JUDGE_TP=2 launch/serve_judge.sh"),
        ("serve-policy", ["PROFILE=gpu"], "launch/serve_policy.sh"),
        ("rl", [], ".venv/bin/emoji-rl grpo --config configs/cpu/grpo.yaml"),
        (
            "eval",
            ["PROFILE=gpu"],
            ".venv/bin/emoji-rl eval-retrieval --config configs/gpu/eval_retrieval.yaml",
        ),
    ],
)
def test_make_targets_run_the_scripts(target, variables, expected):
    result = subprocess.run(
        ["make", "-n", "-f", "launch/targets.mk", target, *variables],
        cwd=ROOT, capture_output=True, text=True, check=True, timeout=30,
    )  # fmt: skip
    assert expected in result.stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_servers_need_the_gpu_profile():
    result = subprocess.run(
        ["make", "-f", "launch/targets.mk", "serve-judge"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode != 0 and "needs PROFILE=gpu" in result.stderr
