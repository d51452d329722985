"""The launch scripts' --dry-run commands carry the flags the GPU setup needs (no GPU, no vLLM here):
each printed command is parsed with shlex, and the launcher's own argument parser reads it where
it is installed (accelerate, torchrun; every stage command, the stage's own config parser)."""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from emoji_rl import cli
from emoji_rl.cli import STAGES
from emoji_rl.config import parse_config
from emoji_rl.decode.vllm import LOGPROBS_MODE

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = [
    "serve_judge.sh",
    "serve_policy.sh",
    "train_grpo.sh",
    "train_sft.sh",
    "eval_retrieval.sh",
    "gpu_smoke.sh",
]
# The default layouts (launch/common.sh), by GPUS: the GPUs of the judge, policy server and trainer.
LAYOUTS = {
    1: (None, None, "0"),
    2: ("0", None, "1"),
    4: ("0,1", "2", "3"),
    8: ("0,1", "2,3", "4,5,6,7"),
}


def run(script, *args, **env):
    # A bare environment, so a setting exported on the developer's machine cannot leak in; GPUS=1
    # unless a test says otherwise, so nvidia-smi on a GPU machine cannot change the layout.
    base = {
        "GPUS": "1",
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
def test_help_lists_the_settings_and_the_layout_and_runs_nothing(script):
    result = run(script, "--help")
    assert result.returncode == 0 and "Settings (environment, default):" in result.stdout
    assert "--dry-run" in result.stdout
    assert "GPU layout" in result.stdout and "\n  8     0,1 (TP 2) " in result.stdout  # the table


# --- serve_judge.sh ------------------------------------------------------------------------------------


def test_judge_server_defaults():
    [argv] = dry_run("serve_judge.sh", GPUS="4")
    env, cmd = split_env(argv)
    assert env == {"CUDA_VISIBLE_DEVICES": "0,1"}
    assert cmd[:3] == ["vllm", "serve", "Qwen/Qwen3-30B-A3B-Instruct-2507"]
    assert flag(cmd, "--host") == "127.0.0.1" and flag(cmd, "--port") == "8001"
    assert flag(cmd, "--served-model-name") == "judge"
    assert flag(cmd, "--tensor-parallel-size") == "2" and flag(cmd, "--data-parallel-size") == "1"
    assert flag(cmd, "--generation-config") == "vllm"
    # Thinking is off per request; a parser or a key on the command line would be wrong here.
    assert not {"--reasoning-parser", "--api-key", "--enable-expert-parallel"} & set(cmd)
    # A text-only model has no multimodal config: vLLM 0.33 would ignore --language-model-only.
    assert "--language-model-only" not in cmd


def test_judge_server_settings_and_the_key_never_printed():
    result = run(
        "serve_judge.sh", "--dry-run", "--max-num-seqs", "256", GPUS="8", TRAIN_GPUS="6,7",
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
    [argv] = dry_run("serve_policy.sh", GPUS="4")
    env, cmd = split_env(argv)
    assert env == {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1", "CUDA_VISIBLE_DEVICES": "2"}
    assert cmd[:3] == ["vllm", "serve", "Qwen/Qwen3.5-4B"]
    # Qwen3.5 is a vision-language model: without this vLLM builds and loads its vision tower.
    assert "--language-model-only" in cmd
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
        ({"POLICY_PREFIX_MATCH_UNIT": "0"}, "POLICY_PREFIX_MATCH_UNIT=0 must be an integer >= 1"),
        (
            {"POLICY_PREFIX_MATCH_UNIT": "16", "POLICY_MODEL": "org/llama-3"},
            "POLICY_PREFIX_MATCH_UNIT=16 is for a hybrid model (Qwen3.5); vLLM refuses it for org/llama-3",
        ),
    ],
)
def test_policy_server_refuses_settings_vllm_would_refuse(env, message):
    result = run("serve_policy.sh", "--dry-run", GPUS="4", **env)
    assert result.returncode == 2 and result.stdout == "" and message in result.stderr


@pytest.mark.parametrize(
    ("k", "loras", "cpu_loras"),
    [(None, "2", "4"), ("0", "2", "4"), ("1", "2", "4"), ("3", "4", "5"), ("6", "7", "8")],
)
def test_policy_server_holds_an_adapter_version_per_update_the_rollouts_may_lag(k, loras, cpu_loras):
    # MAX_OFF_POLICY_STEPS=K: the trainer samples with up to K+1 versions at once; unset, the gpu
    # profile's K=1. The CPU cache also holds the version being published before the oldest unloads.
    env = {"GPUS": "4"} if k is None else {"GPUS": "4", "MAX_OFF_POLICY_STEPS": k}
    [argv] = dry_run("serve_policy.sh", **env)
    assert flag(argv, "--max-loras") == loras and flag(argv, "--max-cpu-loras") == cpu_loras
    # An explicit POLICY_MAX_LORAS raises the CPU cache's default with it (vLLM refuses it below).
    [argv] = dry_run("serve_policy.sh", POLICY_MAX_LORAS="9", **env)
    assert flag(argv, "--max-loras") == "9" and flag(argv, "--max-cpu-loras") == "9"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"POLICY_MAX_LORAS": "1"}, "POLICY_MAX_LORAS=1 is below MAX_OFF_POLICY_STEPS+1 = 2"),
        (
            {"MAX_OFF_POLICY_STEPS": "3", "POLICY_MAX_LORAS": "3"},
            "POLICY_MAX_LORAS=3 is below MAX_OFF_POLICY_STEPS+1 = 4: a trainer with max_off_policy_steps=3 "
            "samples with up to 4 adapter versions at once",
        ),
        ({"MAX_OFF_POLICY_STEPS": "-1"}, "MAX_OFF_POLICY_STEPS=-1 must be an integer >= 0"),
    ],
)
def test_policy_server_refuses_fewer_loras_than_the_versions_in_use(env, message):
    result = run("serve_policy.sh", "--dry-run", GPUS="4", **env)
    assert result.returncode == 2 and result.stdout == "" and message in result.stderr


def test_lockstep_may_serve_one_adapter():
    [argv] = dry_run("serve_policy.sh", GPUS="4", MAX_OFF_POLICY_STEPS="0", POLICY_MAX_LORAS="1")
    assert flag(argv, "--max-loras") == "1"


def hybrid_dir(path: Path, layer_types: list[str]) -> str:
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"model_type": "qwen3_5_text", "layer_types": layer_types}))
    return str(path)


def test_a_hybrid_policy_gets_cache_hits_finer_than_its_blocks_on_gpus(tmp_path):
    # Qwen3.5's blocks are 528, 576 or 640 tokens on a GPU, longer than most turns: without a finer unit a
    # turn reuses nothing of the turns before it (docs/VLLM.md §9).
    [argv] = dry_run("serve_policy.sh", GPUS="4")
    assert flag(argv, "--prefix-match-unit") == "16"
    assert 528 % 16 == 576 % 16 == 640 % 16 == 0  # the unit must divide every block vLLM picks (§9)
    [argv] = dry_run("serve_policy.sh", GPUS="8", POLICY_MODEL="qwen/qwen3.5-9b")
    assert flag(argv, "--prefix-match-unit") == "16"
    local = hybrid_dir(tmp_path / "hybrid", ["linear_attention"] * 3 + ["full_attention"])
    [argv] = dry_run("serve_policy.sh", GPUS="4", POLICY_MODEL=local, POLICY_PREFIX_MATCH_UNIT="64")
    assert flag(argv, "--prefix-match-unit") == "64"
    # Set but empty: vLLM's whole blocks.
    [argv] = dry_run("serve_policy.sh", GPUS="4", POLICY_PREFIX_MATCH_UNIT="")
    assert "--prefix-match-unit" not in argv


def test_a_full_attention_policy_and_the_cpu_layout_get_no_unit(tmp_path):
    full = hybrid_dir(tmp_path / "full", ["full_attention"] * 4)
    for env in ({"GPUS": "4", "POLICY_MODEL": full}, {"GPUS": "4", "POLICY_MODEL": "org/llama-3"}, CPU):
        [argv] = dry_run("serve_policy.sh", **env)
        assert "--prefix-match-unit" not in argv, env
    # On the CPU engine a hybrid model gets none either: a seeded rollout whose prefill is split at a
    # checkpoint fails there (docs/VLLM.md §2).
    hybrid = hybrid_dir(tmp_path / "hybrid", ["linear_attention", "full_attention"])
    [argv] = dry_run("serve_policy.sh", **CPU, POLICY_MODEL=hybrid)
    assert "--prefix-match-unit" not in argv


# --- train_grpo.sh -------------------------------------------------------------------------------------


def accelerate_args(argv):
    from accelerate.commands.launch import launch_command_parser

    assert argv[1:3] == ["-m", "accelerate.commands.launch"]
    return launch_command_parser().parse_args(argv[3:])


def test_grpo_single_node_accelerate():
    [argv] = dry_run("train_grpo.sh", "--max_steps", "2", GPUS="8", NGPUS="4")
    args = accelerate_args(split_env(argv)[1])
    assert (args.num_processes, args.num_machines, args.machine_rank) == (4, 1, 0)
    assert args.config_file == "configs/accelerate/ddp.yaml" and args.main_process_port == 29500
    assert args.module and args.training_script == "emoji_rl.cli"
    assert args.training_script_args == ["grpo", "--config", "configs/gpu/grpo.yaml", "--max_steps", "2"]


def test_grpo_takes_max_off_policy_steps_from_the_environment_before_the_extra_arguments():
    [argv] = dry_run("train_grpo.sh", "--max_steps", "2", GPUS="4", MAX_OFF_POLICY_STEPS="3")
    args = accelerate_args(split_env(argv)[1]).training_script_args
    assert args[3:] == ["--max_off_policy_steps", "3", "--max_steps", "2"]
    # Unset (or empty): the config file's value stands.
    for env in ({}, {"MAX_OFF_POLICY_STEPS": ""}):
        [argv] = dry_run("train_grpo.sh", GPUS="4", **env)
        assert "--max_off_policy_steps" not in accelerate_args(split_env(argv)[1]).training_script_args
    # A flag that agrees is harmless; so is any flag with the variable unset (the config's field).
    for env, flags in (
        ({"MAX_OFF_POLICY_STEPS": "2"}, ["--max_off_policy_steps", "2"]),
        ({}, ["--max_off_policy_steps=5"]),
    ):
        [argv] = dry_run("train_grpo.sh", *flags, GPUS="4", **env)
        assert accelerate_args(split_env(argv)[1]).training_script_args[-len(flags) :] == flags


@pytest.mark.parametrize("flags", [["--max_off_policy_steps", "2"], ["--max_off_policy_steps=2"]])
def test_grpo_refuses_a_max_off_policy_steps_flag_the_policy_server_was_not_sized_for(flags):
    result = run("train_grpo.sh", "--dry-run", *flags, GPUS="4", MAX_OFF_POLICY_STEPS="1")
    assert result.returncode == 2 and result.stdout == ""
    assert "--max_off_policy_steps 2 disagrees with MAX_OFF_POLICY_STEPS=1" in result.stderr
    assert "set MAX_OFF_POLICY_STEPS=2 for launch/serve_policy.sh and this script both" in result.stderr


@pytest.mark.parametrize("script", ["gpu_smoke.sh", "with_servers.sh"])
def test_max_off_policy_steps_reaches_the_policy_server_and_the_trainer_alike(script):
    args = (
        ("judge,policy", "--dry-run", "--", "launch/train_grpo.sh")
        if script == "with_servers.sh"
        else ("--dry-run",)
    )
    result = run(script, *args, GPUS="8", MAX_OFF_POLICY_STEPS="3")
    assert result.returncode == 0, result.stderr
    commands = [shlex.split(line) for line in result.stdout.splitlines() if line and not line.startswith("#")]
    [policy] = [argv for argv in commands if "--enable-lora" in argv]
    [grpo] = [argv for argv in commands if "grpo" in argv and "emoji_rl.cli" in argv]
    assert flag(policy, "--max-loras") == "4"
    assert flag(accelerate_args(split_env(grpo)[1]).training_script_args, "--max_off_policy_steps") == "3"


# A node without servers gives the trainer all its GPUs (empty settings: no judge, no policy here).
TRAINER_NODE = {"JUDGE_GPUS": "", "POLICY_GPUS": "", "TRAIN_GPUS": "0,1,2,3,4,5,6,7"}


def test_grpo_multi_node_accelerate_counts_processes_over_all_nodes():
    env = {"NNODES": "2", "NODE_RANK": "1", "MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "29555", **TRAINER_NODE}
    [argv] = dry_run("train_grpo.sh", STRATEGY="fsdp", **env)
    env, cmd = split_env(argv)
    assert env == {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}
    args = accelerate_args(cmd)
    assert (args.num_processes, args.num_machines, args.machine_rank) == (16, 2, 1)
    assert (args.main_process_ip, args.main_process_port) == ("10.1.2.3", 29555)
    assert args.config_file == "configs/accelerate/fsdp.yaml"
    # Node 1 has no policy server, but the job's rollouts may use node 0's: the config decides.
    assert "--engine" not in args.training_script_args


def test_grpo_torchrun():
    from torch.distributed.run import get_args_parser

    env = {"NNODES": "2", "NODE_RANK": "1", "MASTER_ADDR": "10.1.2.3", "LAUNCHER": "torchrun", **TRAINER_NODE}
    [argv] = dry_run("train_grpo.sh", **env)
    argv = split_env(argv)[1]
    assert argv[1:3] == ["-m", "torch.distributed.run"]
    args = get_args_parser().parse_args(argv[3:])
    assert (args.nnodes, args.node_rank, args.nproc_per_node) == ("2", 1, "8")
    assert (args.master_addr, args.master_port) == ("10.1.2.3", 29500)
    assert args.module and args.training_script == "emoji_rl.cli"


def test_grpo_on_chosen_gpus_takes_one_process_per_gpu():
    [argv] = dry_run("train_grpo.sh", GPUS="4", TRAIN_GPUS="2,3", POLICY_GPUS="")
    env, cmd = split_env(argv)
    assert env == {"CUDA_VISIBLE_DEVICES": "2,3"} and accelerate_args(cmd).num_processes == 2


def test_grpo_refuses_ngpus_other_than_its_gpus():
    result = run("train_grpo.sh", "--dry-run", GPUS="4", NGPUS="4")
    assert result.returncode == 2 and result.stdout == ""
    assert "NGPUS=4, but TRAIN_GPUS=3 holds 1 GPU(s)" in result.stderr


def test_grpo_refuses_a_node_rank_outside_the_job():
    result = run("train_grpo.sh", "--dry-run", NNODES="2", NODE_RANK="2")
    assert result.returncode == 2 and "NODE_RANK=2 must be below NNODES=2" in result.stderr


@pytest.mark.parametrize("name", ["ddp", "fsdp"])
def test_accelerate_configs_parse(name):
    config = yaml.safe_load((ROOT / "configs" / "accelerate" / f"{name}.yaml").read_text())
    assert config["distributed_type"] in {"MULTI_GPU", "FSDP"} and config["mixed_precision"] == "bf16"


# --- the GPU layout ------------------------------------------------------------------------------------


def gpus_of(argv):
    """The CUDA_VISIBLE_DEVICES a printed command runs with, as a set (none: None)."""
    visible = split_env(argv)[0].get("CUDA_VISIBLE_DEVICES")
    return None if visible is None else set(visible.split(","))


def as_set(gpus):
    return None if gpus is None else set(gpus.split(","))


def layout_commands(**env):
    """The judge, policy-server (None where the layout has none), GRPO and eval commands."""
    judge = policy = None
    if run("serve_judge.sh", "--dry-run", **env).returncode == 0:
        [judge] = dry_run("serve_judge.sh", **env)
    if run("serve_policy.sh", "--dry-run", **env).returncode == 0:
        [policy] = dry_run("serve_policy.sh", **env)
    [grpo] = dry_run("train_grpo.sh", **env)
    [evaluate] = dry_run("eval_retrieval.sh", **env)
    return judge, policy, grpo, evaluate


@pytest.mark.parametrize("gpus", sorted(LAYOUTS))
def test_each_layout_gives_judge_policy_and_trainer_disjoint_gpus(gpus):
    judge, policy, grpo, evaluate = layout_commands(GPUS=str(gpus))
    judge_gpus, policy_gpus, train_gpus = LAYOUTS[gpus]
    assert (None if judge is None else gpus_of(judge)) == as_set(judge_gpus)
    assert (None if policy is None else gpus_of(policy)) == as_set(policy_gpus)
    assert gpus_of(grpo) == gpus_of(evaluate) == as_set(train_gpus)
    sets = [s for s in (as_set(judge_gpus), as_set(policy_gpus), as_set(train_gpus)) if s]
    assert sum(map(len, sets)) == len(set().union(*sets)) <= gpus  # disjoint, on the box
    stage = accelerate_args(split_env(grpo)[1])
    assert stage.num_processes == len(as_set(train_gpus))
    # vLLM starts TP x DP workers, one per visible GPU.
    for server in filter(None, (judge, policy)):
        size = int(flag(server, "--tensor-parallel-size")) * int(flag(server, "--data-parallel-size"))
        assert size == len(gpus_of(server))
    if policy is None:  # no policy server: rollouts in the trainer's process, which cannot run ahead
        assert flag(stage.training_script_args, "--engine") == "hf"
        assert flag(stage.training_script_args, "--max_off_policy_steps") == "0"
    else:
        assert "--engine" not in stage.training_script_args  # the config's vllm
        # Runtime-loaded adapters live in one API process's table: vLLM refuses more than one.
        assert flag(policy, "--api-server-count") == "1"


def test_policy_server_replicas_on_eight_gpus():
    _, policy, grpo, _ = layout_commands(GPUS="8")
    assert flag(policy, "--tensor-parallel-size") == "1" and flag(policy, "--data-parallel-size") == "2"
    assert accelerate_args(split_env(grpo)[1]).num_processes == 4  # 32 prompts a step divide


def test_gpus_defaults_to_what_nvidia_smi_lists(tmp_path):
    fake = tmp_path / "nvidia-smi"
    fake.write_text('#!/bin/sh\nfor i in 0 1 2 3 4 5 6 7; do echo "GPU $i: NVIDIA H100 80GB HBM3"; done\n')
    fake.chmod(0o755)
    path = f"{tmp_path}{os.pathsep}{os.environ['PATH']}"
    env = {"PATH": path, "HOME": "/tmp", "PYTHON": "python3", "VLLM": "vllm"}
    result = subprocess.run(
        ["bash", str(ROOT / "launch" / "train_grpo.sh"), "--dry-run"],
        env=env, capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    assert gpus_of(shlex.split(result.stdout)) == {"4", "5", "6", "7"}


def test_another_gpu_count_takes_the_largest_layout_and_names_the_idle_gpus():
    result = run("train_grpo.sh", "--dry-run", GPUS="6")
    assert result.returncode == 0 and gpus_of(shlex.split(result.stdout)) == {"3"}
    assert "the 4-GPU layout leaves GPU 4,5 idle" in result.stderr


OVERLAP = "POLICY_GPUS=1 and TRAIN_GPUS=1,2 share GPU 1"


@pytest.mark.parametrize("script", [s for s in SCRIPTS if s != "train_sft.sh"])
def test_overlapping_gpus_are_refused_before_anything_starts(script):
    result = run(script, "--dry-run", GPUS="4", JUDGE_GPUS="0", POLICY_GPUS="1", TRAIN_GPUS="1,2")
    assert result.returncode == 2 and result.stdout == ""
    assert OVERLAP in result.stderr


def test_overlap_names_every_shared_gpu():
    result = run("serve_judge.sh", "--dry-run", GPUS="8", JUDGE_GPUS="0,1,2", POLICY_GPUS="2,3")
    assert result.returncode == 2
    assert "JUDGE_GPUS=0,1,2 and POLICY_GPUS=2,3 share GPU 2" in result.stderr
    assert "JUDGE_GPUS=0,1,2 and TRAIN_GPUS=4,5,6,7" not in result.stderr


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"GPUS": "4", "JUDGE_TP": "1"}, "JUDGE_TP=1 x JUDGE_DP=1 = 1, but JUDGE_GPUS=0,1 lists 2 GPU(s)"),
        ({"GPUS": "4", "JUDGE_TP": "4"}, "JUDGE_TP=4 x JUDGE_DP=1 = 4, but JUDGE_GPUS=0,1 lists 2 GPU(s)"),
        (
            {"GPUS": "8", "POLICY_DP": "3"},
            "POLICY_TP=1 x POLICY_DP=3 = 3, but POLICY_GPUS=2,3 lists 2 GPU(s)",
        ),
        ({"GPUS": "8", "POLICY_TP": "3"}, "POLICY_GPUS=2,3 (2 GPUs) does not split into POLICY_TP=3"),
        ({"GPUS": "4", "TRAIN_GPUS": "3,3"}, "TRAIN_GPUS=3,3 names GPU 3 twice"),
        ({"GPUS": "4", "JUDGE_GPUS": "0 1"}, "JUDGE_GPUS=0 1 must be GPU ids separated by commas"),
    ],
)
def test_parallel_sizes_that_do_not_fill_their_gpus_are_refused(env, message):
    for script in ("serve_judge.sh", "train_grpo.sh", "gpu_smoke.sh"):
        result = run(script, "--dry-run", **env)
        assert result.returncode == 2 and message in result.stderr, (script, result.stderr)


def test_two_gpu_layout_has_no_policy_server_unless_asked():
    result = run("serve_policy.sh", "--dry-run", GPUS="2")
    assert result.returncode == 2 and result.stdout == ""
    assert "the 2-GPU layout (GPUS=2) has no policy server" in result.stderr
    [argv] = dry_run("serve_policy.sh", GPUS="2", POLICY_GPUS="1", TRAIN_GPUS="")
    assert gpus_of(argv) == {"1"}


# --- the CPU layout (GPUS=0) ------------------------------------------------------------------------------

CPU = {
    "GPUS": "0",
    "PYTHON": sys.executable,
    # The cache this process resolves embedded models in (EMOJI_RL_CACHE, when set), for the script's.
    **{k: v for k, v in os.environ.items() if k == "EMOJI_RL_CACHE"},
}  # the CPU layout resolves embedded models with emoji-rl's Python


@pytest.mark.parametrize(
    ("script", "env"),
    [("serve_judge.sh", {}), ("serve_policy.sh", {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"})],
)
def test_the_cpu_layout_serves_the_embedded_model_on_vllms_cpu_engine(script, env):
    from emoji_rl.lm import models

    [argv] = dry_run(script, **CPU)
    served_env, cmd = split_env(argv)
    cpu_env = {
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "OMP_WAIT_POLICY": "PASSIVE",
    }
    assert served_env == {**env, **cpu_env}
    assert cmd[:3] == ["vllm", "serve", models.resolve(models.SMOLLM2)]
    assert flag(cmd, "--dtype") == "float32"
    assert not {"--tensor-parallel-size", "--data-parallel-size", "--gpu-memory-utilization"} & set(cmd)
    [argv] = dry_run(script, CPU_KVCACHE_GIB="4", JUDGE_MODEL="/models/j", POLICY_MODEL="/models/p", **CPU)
    served_env, cmd = split_env(argv)
    assert served_env["VLLM_CPU_KVCACHE_SPACE"] == "4" and cmd[2] in ("/models/j", "/models/p")


def test_the_cpu_layout_takes_the_engines_venv_when_it_is_built(tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "launch", repo / "launch")
    engine = repo / ".venv-vllm-engine" / "bin" / "vllm"
    engine.parent.mkdir(parents=True)
    engine.write_text("")
    engine.chmod(0o755)
    env = CPU | {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}
    result = subprocess.run(
        ["bash", str(repo / "launch" / "serve_policy.sh"), "--dry-run", "--served-model-name", "p"],
        env={**env, "POLICY_MODEL": "/models/p"}, capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    _, cmd = split_env(shlex.split(result.stdout))
    assert cmd[:2] == [".venv-vllm-engine/bin/vllm", "serve"]


def test_the_cpu_layout_refuses_gpu_ids():
    result = run("serve_judge.sh", "--dry-run", JUDGE_GPUS="0", **CPU)
    assert result.returncode == 2 and result.stdout == ""
    assert "GPUS=0 runs everything on the CPU, but JUDGE_GPUS=0" in result.stderr


def test_grpo_on_the_cpu_layout_is_one_process_beside_the_policy_server():
    [argv] = dry_run("train_grpo.sh", "--max_steps", "2", CONFIG="configs/cpu/grpo.yaml", **CPU)
    assert argv == [
        "env", "CUDA_VISIBLE_DEVICES=", "OMP_WAIT_POLICY=PASSIVE", sys.executable, "-m", "emoji_rl.cli", "grpo",
        "--config", "configs/cpu/grpo.yaml", "--max_steps", "2",
    ]  # fmt: skip


@pytest.mark.parametrize("script", ["train_sft.sh", "train_grpo.sh"])
def test_the_cpu_layout_runs_a_node_of_gloo_processes(script):
    # Several nodes without GPUs (tests/test_two_nodes.py runs two on one machine): NGPUS processes
    # per node, 1 unless set, through the launcher.
    env = {"NNODES": "2", "NODE_RANK": "1", "MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "29555", **CPU}
    [argv] = dry_run(script, **env)
    env_vars, cmd = split_env(argv)
    # GRPO's processes share the cores with the servers, SFT's have them to themselves.
    passive = {"OMP_WAIT_POLICY": "PASSIVE"} if script == "train_grpo.sh" else {}
    assert env_vars == {"CUDA_VISIBLE_DEVICES": "", **passive}
    args = accelerate_args(cmd)
    assert (args.num_processes, args.num_machines, args.machine_rank) == (2, 2, 1)
    assert (args.main_process_ip, args.main_process_port) == ("10.1.2.3", 29555)
    [argv] = dry_run(script, LAUNCHER="torchrun", NGPUS="2", **CPU)
    cmd = split_env(argv)[1]
    assert cmd[1:3] == ["-m", "torch.distributed.run"]
    from torch.distributed.run import get_args_parser

    args = get_args_parser().parse_args(cmd[3:])
    assert (args.nnodes, args.node_rank, args.nproc_per_node) == ("1", 0, "2")
    assert args.module and args.training_script == "emoji_rl.cli"


def test_sft_takes_the_node_settings_of_grpo():
    env = {"NNODES": "2", "NODE_RANK": "1", "MASTER_ADDR": "10.1.2.3", "LAUNCHER": "torchrun"}
    [argv] = dry_run("train_sft.sh", GPUS="8", **env)
    from torch.distributed.run import get_args_parser

    args = get_args_parser().parse_args(argv[3:])
    assert (args.nnodes, args.node_rank, args.nproc_per_node) == ("2", 1, "8")
    assert (args.master_addr, args.master_port) == ("10.1.2.3", 29500)
    assert args.training_script_args[:1] == ["sft"]
    result = run("train_sft.sh", "--dry-run", GPUS="8", MAIN_PORT="29600")
    assert result.returncode == 2 and "MAIN_PORT=29600: the setting is MASTER_PORT now" in result.stderr
    result = run("train_sft.sh", "--dry-run", STRATEGY="fsdp", LAUNCHER="torchrun")
    assert result.returncode == 2 and "STRATEGY=fsdp needs LAUNCHER=accelerate" in result.stderr


def test_gpu_smoke_on_the_cpu_layout_starts_both_servers_and_rolls_out_with_vllm():
    result = run("gpu_smoke.sh", "--dry-run", **CPU)
    assert result.returncode == 0, result.stderr
    stages = [line.split(":")[0] for line in result.stdout.splitlines() if line.startswith("# stage")]
    assert stages == ["# stage judge-server", "# stage policy-server", "# stage grpo", "# stage eval"]
    [grpo] = [
        shlex.split(line)
        for line in result.stdout.splitlines()
        if " grpo " in line and "emoji_rl.cli" in line
    ]
    assert flag(grpo, "--engine") == "vllm" and grpo[:2] == ["env", "CUDA_VISIBLE_DEVICES="]


def test_sft_runs_alone_on_every_gpu_or_on_train_gpus():
    [argv] = dry_run("train_sft.sh", GPUS="8")
    env, cmd = split_env(argv)
    assert env == {} and accelerate_args(cmd).num_processes == 8  # not the layout's TRAIN_GPUS
    [argv] = dry_run("train_sft.sh", GPUS="8", TRAIN_GPUS="2,3")
    env, cmd = split_env(argv)
    assert env == {"CUDA_VISIBLE_DEVICES": "2,3"} and accelerate_args(cmd).num_processes == 2


# --- every stage command parses with its stage's own config parser -------------------------------------


def stage_commands(argv):
    """`emoji-rl STAGE ...` or `python -m emoji_rl.cli STAGE ...` inside a printed command."""
    for i, arg in enumerate(argv):
        if (arg == "emoji_rl.cli" and argv[i - 1] == "-m") or arg.endswith("/emoji-rl"):
            return [(argv[i + 1], argv[i + 2 :])]
    return []


def parse_stage(stage, args):
    """The stage's Config from `args`, as `emoji-rl` would build it; unknown args fail the test."""
    module = importlib.import_module(STAGES[stage][0])
    args = cli.stage_argv(stage, args)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return parse_config(cli.config_class(module, args), args, prog=f"emoji-rl {stage}")
    except SystemExit:
        pytest.fail(f"emoji-rl {stage} {shlex.join(args)}:\n{err.getvalue()}")


@pytest.mark.parametrize("gpus", [2, 4, 8])
def test_every_stage_command_the_scripts_print_parses(gpus, monkeypatch):
    monkeypatch.chdir(ROOT)  # the commands name their config files from the repository root
    found = []
    for script in ("gpu_smoke.sh", "train_grpo.sh", "train_sft.sh", "eval_retrieval.sh"):
        for argv in dry_run(script, GPUS=str(gpus)):
            for stage, args in stage_commands(argv):
                found.append((script, stage))
                parse_stage(stage, args)
    assert {stage for _, stage in found} == {"grpo", "sft", "eval-retrieval"}
    assert ("gpu_smoke.sh", "grpo") in found and ("gpu_smoke.sh", "eval-retrieval") in found


# --- gpu_smoke.sh --------------------------------------------------------------------------------------


def test_gpu_smoke_dry_run_prints_every_stage():
    result = run("gpu_smoke.sh", "--dry-run", GPUS="4")
    assert result.returncode == 0, result.stderr
    comments = [line for line in result.stdout.splitlines() if line.startswith("#")]
    assert [c.split(":")[0] for c in comments if c.startswith("# stage")] == [
        "# stage judge-server", "# stage policy-server", "# stage grpo", "# stage eval", "# stage sampling",
        "# stage prefix-cache",
    ]  # fmt: skip
    judge, policy, wait_judge, wait_policy, grpo, evaluate, sampling, prefix = dry_run(
        "gpu_smoke.sh", GPUS="4"
    )
    assert gpus_of(judge) == {"0", "1"} and flag(judge, "--tensor-parallel-size") == "2"
    assert gpus_of(policy) == {"2"}
    assert wait_judge[1:4] == ["-m", "emoji_rl.io.endpoint", "http://127.0.0.1:8001"]
    assert wait_policy[3] == "http://127.0.0.1:8002"
    assert gpus_of(grpo) == gpus_of(evaluate) == {"3"}
    stage = accelerate_args(split_env(grpo)[1]).training_script_args
    assert flag(stage, "--max_steps") == "2" and flag(stage, "--engine") == "vllm"
    assert flag(stage, "--vllm_url") == "http://127.0.0.1:8002" and flag(stage, "--judge") == "openai"
    assert flag(stage, "--judge_url") == "http://127.0.0.1:8001"
    assert flag(stage, "--judge_model") == "judge"  # the served name, as serve_judge.sh serves it
    assert "eval-retrieval" in evaluate and flag(evaluate, "--judge") == "openai"
    assert flag(evaluate, "--judge_model") == "judge"
    assert evaluate[evaluate.index("--systems") :][:3] == [
        "--systems",
        "base",
        "rl=runs/gpu-smoke/grpo/adapter",
    ]
    # The policy server's tokens/s with and without the rollouts' seed and padding bias, measured by
    # `make bench`'s own arms: its parser takes the printed flags.
    from emoji_rl.bench import sampling as bench_sampling

    assert sampling[1:3] == ["-m", "emoji_rl.bench.sampling"]
    with pytest.raises(SystemExit), contextlib.redirect_stdout(io.StringIO()):
        bench_sampling.main([*sampling[3:], "--help"])
    assert flag(sampling, "--url") == "http://127.0.0.1:8002" and flag(sampling, "--model") == "policy"
    assert flag(sampling, "--api_key_env") == "POLICY_API_KEY"
    # The policy server's prefix-cache hit rate on multi-turn episodes and the block it settled on
    # (docs/VLLM.md §9), by `make bench`'s own episodes: its parser takes the printed flags.
    from emoji_rl.bench import prefix_cache as bench_prefix_cache

    assert prefix[1:3] == ["-m", "emoji_rl.bench.prefix_cache"]
    with pytest.raises(SystemExit), contextlib.redirect_stdout(io.StringIO()):
        bench_prefix_cache.main([*prefix[3:], "--help"])
    assert flag(prefix, "--url") == "http://127.0.0.1:8002" and flag(prefix, "--model") == "policy"
    assert flag(prefix, "--api_key_env") == "POLICY_API_KEY"


def test_gpu_smoke_on_two_gpus_runs_grpo_in_process_without_a_policy_server():
    result = run("gpu_smoke.sh", "--dry-run", GPUS="2")
    assert result.returncode == 0, result.stderr
    assert "policy-server" not in result.stdout and ":8002" not in result.stdout
    judge, wait_judge, grpo, evaluate = dry_run("gpu_smoke.sh", GPUS="2")
    assert gpus_of(judge) == {"0"} and flag(judge, "--tensor-parallel-size") == "1"
    assert wait_judge[3] == "http://127.0.0.1:8001"
    assert gpus_of(grpo) == gpus_of(evaluate) == {"1"}
    stage = accelerate_args(split_env(grpo)[1]).training_script_args
    assert flag(stage, "--engine") == "hf" and "--vllm_url" not in stage


def test_gpu_smoke_on_eight_gpus():
    judge, policy, _, _, grpo, evaluate, _, _ = dry_run("gpu_smoke.sh", GPUS="8")
    assert gpus_of(judge) == {"0", "1"} and gpus_of(policy) == {"2", "3"}
    assert gpus_of(grpo) == gpus_of(evaluate) == {"4", "5", "6", "7"}


# --- make targets ----------------------------------------------------------------------------------------


def make(*args, **env):
    return subprocess.run(
        ["make", "-s", "-f", "launch/targets.mk", *args],
        cwd=ROOT, env={"PATH": os.environ["PATH"], "HOME": "/tmp", "PYTHON": "python3", **env},
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
@pytest.mark.parametrize("gpus", [2, 4, 8])
@pytest.mark.parametrize("target", ["rl", "eval"])
def test_make_rl_and_eval_run_on_train_gpus(target, gpus):
    result = make(target, "PROFILE=gpu", f"GPUS={gpus}", "ARGS=--dry-run --max_steps 3")
    assert result.returncode == 0, result.stderr
    [argv] = [shlex.split(line) for line in result.stdout.splitlines() if "emoji_rl.cli" in line]
    assert gpus_of(argv) == as_set(LAYOUTS[gpus][2])
    assert argv[-2:] == ["--max_steps", "3"]


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_passes_max_off_policy_steps_to_the_policy_server_and_the_trainer():
    k = "MAX_OFF_POLICY_STEPS=3"
    result = make("serve-policy", "PROFILE=gpu", "GPUS=4", k, "ARGS=--dry-run", VLLM="vllm")
    assert result.returncode == 0, result.stderr
    [policy] = [shlex.split(line) for line in result.stdout.splitlines() if " serve " in line]
    assert flag(policy, "--max-loras") == "4"
    result = make("rl", "PROFILE=gpu", "GPUS=4", k, "ARGS=--dry-run")
    [grpo] = [shlex.split(line) for line in result.stdout.splitlines() if "emoji_rl.cli" in line]
    assert flag(grpo, "--max_off_policy_steps") == "3"


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
@pytest.mark.parametrize(
    ("target", "variables", "expected"),
    [
        ("rl", ["PROFILE=gpu", "ARGS=--max_steps 3"], "launch/train_grpo.sh --max_steps 3"),
        ("sft", ["PROFILE=gpu"], "launch/train_sft.sh"),
        ("serve-judge", ["PROFILE=gpu"], "launch/serve_judge.sh"),
        ("serve-policy", ["PROFILE=gpu"], "launch/serve_policy.sh"),
        ("eval", ["PROFILE=gpu"], "launch/eval_retrieval.sh"),
        ("rl", [], ".venv/bin/emoji-rl grpo --config configs/cpu/grpo.yaml"),
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
    result = make("serve-judge")
    assert result.returncode != 0 and "needs PROFILE=gpu" in result.stderr


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_serve_judge_refuses_the_old_ngpus():
    result = make("serve-judge", "PROFILE=gpu", "NGPUS=2")
    assert result.returncode == 2 and "set JUDGE_GPUS" in result.stderr


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
@pytest.mark.parametrize("target", ["demo", "play-web", "eval-human"])
def test_every_stage_command_of_a_make_target_parses(target, monkeypatch):
    # STAMP= : print the target's own recipe, not the venv set-up it depends on.
    printed = subprocess.run(["make", "-n", target, "STAMP="], cwd=ROOT, capture_output=True,
                             text=True, check=True, timeout=30).stdout  # fmt: skip
    monkeypatch.chdir(ROOT)
    lines = printed.replace("\\\n", " ").splitlines()  # make -n keeps a recipe's continued lines
    commands = [c for line in lines for c in stage_commands(shlex.split(line))]
    assert commands, printed
    for stage, args in commands:
        parse_stage(stage, args)


# --- launch/vllm_engine/build.sh ---------------------------------------------------------------------------


def test_the_engine_build_names_the_step_that_failed_and_its_log(tmp_path):
    """A failed step says which and where its log is, and leaves no mark: the next run retries it."""
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "EMOJI_RL_CACHE": str(tmp_path / "cache"),
        "PYTHON": "false",  # the interpreter the steps use: the first step that runs it fails
    }
    result = subprocess.run(
        ["bash", str(ROOT / "launch/vllm_engine/build.sh")],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 1
    [root] = (tmp_path / "cache" / "vllm-engine").glob("*/logs")
    assert f"vllm-engine: step 'sdist' failed; the last lines of {root}/sdist.log:" in result.stderr
    assert not (root.parent / "done" / "sdist").exists()
    venv = subprocess.run(
        ["bash", str(ROOT / "launch/vllm_engine/build.sh"), "--print-venv"],
        env=env, capture_output=True, text=True, timeout=30, check=True,
    ).stdout.strip()  # fmt: skip
    assert venv == str(root.parent / "venv")
